"""The requests an engine has taken in and not yet finished, each sample on its own.

A request with params.n > 1 fans out here into its samples: the first is the request
itself, the others wait on it (Request.pending_forks) until the scheduler forks them at the
end of its prompt (engine/scheduler.py). Every sample is tracked by its own id, and the
group by the first sample's id, which is the id a client aborts."""

from __future__ import annotations

from engine.request import Request


class InFlight:
    """Engine thread only (other threads may read its length)."""

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}  # every unfinished sample, by its own id
        self._groups: dict[str, list[Request]] = {}  # first sample's id -> all its samples

    def take(self, request: Request) -> list[Request]:
        """Fan a new request out into its samples (itself first) and track them all."""
        request.pending_forks = [request.fork(i) for i in range(1, request.params.n)]
        group = [request, *request.pending_forks]
        self._groups[request.request_id] = group
        for sample in group:
            self._requests[sample.request_id] = sample
        return group

    def group(self, request_id: str) -> list[Request]:
        """The samples of the request with this id (none if it is not known)."""
        return self._groups.get(request_id, [])

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def get(self, request_id: str) -> Request | None:
        """The unfinished sample with this (its own) id, if there is one."""
        return self._requests.get(request_id)

    def all(self) -> list[Request]:
        """Every unfinished sample, in the order they were taken in (a copy)."""
        return list(self._requests.values())

    def forget(self, request: Request) -> None:
        """Drop a finished sample, and its group once every sample has finished."""
        self._requests.pop(request.request_id, None)
        group = self._groups.get(request.group_id, [])
        if all(sample.request_id not in self._requests for sample in group):
            self._groups.pop(request.group_id, None)

    def clear(self) -> None:
        self._requests.clear()
        self._groups.clear()
