"""The order of the waiting line: first come first served, or by priority with aging.

The scheduler uses a deque's operations on its line (`append`, `appendleft` for a preempted
request, `popleft`, `[0]` for the front, `remove`, `in`, `len`), so for first come first
served the line is a plain deque. `PriorityQueue` keeps the same operations but orders the
line by each request's `priority` (lower first, vLLM's convention), with aging so that
nothing starves.

Aging: a request's rank is `priority - waited / aging`, i.e. each `aging` seconds of waiting
is worth one priority level. Every waiting request ages at the same rate, so the order of
two requests never changes while they wait: rank order is the order of the fixed key
`priority + arrival_time / aging`. A request is therefore passed only by requests that
arrived before `its arrival + (its priority - theirs) * aging` — finitely many — and then
it is at the front. Ties go to the earlier arrival.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from engine.request import Request


class PriorityQueue:
    """A waiting line ordered by priority with aging (see the module's docstring)."""

    def __init__(self, aging: float) -> None:
        self.aging = aging  # seconds of waiting worth one priority level; 0 = no aging
        self._keys: list[tuple[float, float, int]] = []  # sorted, beside _requests
        self._requests: list[Request] = []
        self._counter = 0  # a tie-break that keeps insertion order among equal keys

    def key(self, request: Request) -> tuple[float, float]:
        aged = request.arrival_time / self.aging if self.aging > 0 else 0.0
        return request.priority + aged, request.arrival_time

    def append(self, request: Request) -> None:
        self._counter += 1
        entry = (*self.key(request), self._counter)
        i = bisect.bisect(self._keys, entry)
        self._keys.insert(i, entry)
        self._requests.insert(i, request)

    # A preempted request goes back by its own key: its arrival time is old, so it returns
    # ahead of every later arrival of its priority.
    appendleft = append

    def popleft(self) -> Request:
        self._keys.pop(0)
        return self._requests.pop(0)

    def remove(self, request: Request) -> None:
        i = self._requests.index(request)
        del self._keys[i], self._requests[i]

    def __getitem__(self, index: int) -> Request:
        return self._requests[index]

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._requests))

    def __contains__(self, request: object) -> bool:
        return any(r is request for r in self._requests)


def make_waiting_queue(policy: str, aging: float) -> deque[Request] | PriorityQueue:
    """The waiting line for --scheduling-policy `policy`."""
    if policy == "fcfs":
        return deque()
    if policy == "priority":
        return PriorityQueue(aging)
    raise ValueError(f"unknown scheduling policy {policy!r}")
