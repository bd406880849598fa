"""How fast the waiting line drains, measured, and what it tells a client that was refused.

The engine thread reports the line after every step (`DrainRate.observe`): how many requests
and prompt tokens wait, and how many joined since the last report. Whatever was in the line
and is no longer (seated, or aborted while waiting) drained. Only intervals in which the line
was not empty count: an idle server says nothing about how fast it would seat a crowd. The
rates are averages over roughly the last `window` seconds, older intervals weighing
exponentially less, so the figure follows a change of load within a window.

A 429's Retry-After is then the time the line needs to drain enough for the refused request
to fit, at the measured rate, rounded up and kept within [1, MAX_RETRY_AFTER] seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineConfig

DEFAULT_RETRY_AFTER = 1  # seconds, while nothing has been measured yet
MAX_RETRY_AFTER = 60


class EngineUnavailableError(RuntimeError):
    """The engine takes no new requests: it is shutting down, or it has died (HTTP 503)."""


class QueueFullError(RuntimeError):
    """The waiting line is at --max-waiting or --max-num-queued-tokens."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, from the measured drain rate


@dataclass
class LineSize:
    requests: int = 0
    tokens: int = 0  # prompt tokens still to compute


class DrainRate:
    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self._last: tuple[float, LineSize] | None = None
        self._busy_seconds = 0.0  # decayed sums over the intervals with a line
        self._drained_requests = 0.0
        self._drained_tokens = 0.0

    def observe(self, now: float, line: LineSize, joined: LineSize) -> None:
        """The line after a step, and what joined it since the previous call."""
        if self._last is not None:
            then, before = self._last
            had_line = before.requests + joined.requests > 0
            elapsed = now - then
            if had_line and elapsed > 0:
                decay = math.exp(-elapsed / self.window)
                self._busy_seconds = self._busy_seconds * decay + elapsed
                self._drained_requests = self._drained_requests * decay + max(
                    before.requests + joined.requests - line.requests, 0)
                self._drained_tokens = self._drained_tokens * decay + max(
                    before.tokens + joined.tokens - line.tokens, 0)
        self._last = (now, line)

    @property
    def requests_per_second(self) -> float | None:
        """None until a busy interval has been seen."""
        return self._drained_requests / self._busy_seconds if self._busy_seconds else None

    @property
    def tokens_per_second(self) -> float | None:
        return self._drained_tokens / self._busy_seconds if self._busy_seconds else None

    def retry_after(self, excess_requests: int = 0, excess_tokens: int = 0) -> int:
        """Whole seconds until `excess_requests` requests and `excess_tokens` prompt tokens
        have left the line at the measured rates."""
        return retry_seconds(self.requests_per_second, self.tokens_per_second,
                             excess_requests, excess_tokens)


def retry_seconds(requests_per_second: float | None, tokens_per_second: float | None,
                  excess_requests: int = 0, excess_tokens: int = 0) -> int:
    """DrainRate.retry_after from the two rates (None: nothing measured yet), for a process
    that only sees the rates another one measured."""
    if requests_per_second is None and tokens_per_second is None:
        return DEFAULT_RETRY_AFTER
    seconds = 0.0
    for excess, rate in ((excess_requests, requests_per_second),
                         (excess_tokens, tokens_per_second)):
        if excess > 0:
            seconds = max(seconds, excess / rate if rate else math.inf)
    # At most MAX_RETRY_AFTER before rounding up: a rate of 0 (a line nothing has left yet)
    # makes the wait infinite, which has no integer.
    return max(math.ceil(min(seconds, MAX_RETRY_AFTER) - 1e-6), 1)  # - 1e-6: float dust


def check_line(config: EngineConfig, request_tokens: int, running: int, waiting: int,
               inbox_tokens: Sequence[int], line_tokens: int,
               retry_after: Callable[..., int]) -> None:
    """Raise QueueFullError if the line is full by count or by prompt tokens (a request alone
    in the line is never refused for its length).

    `running` and `waiting` are the core's seated and waiting requests, `inbox_tokens` the
    prompt lengths of requests accepted but not yet taken in by the core (in arrival order),
    `line_tokens` the prompt tokens the core's line still has to compute, `retry_after`
    DrainRate.retry_after or its like. Requests the free seats await are not counted as
    waiting, by count or by tokens: a burst that arrives between two steps sits in the inbox
    even while seats are free. Each request counts as one seat (a request with n samples
    needs n, so this errs towards admitting)."""
    free_seats = max(0, config.max_num_seqs - running)
    queued_requests = max(0, len(inbox_tokens) + waiting - free_seats)
    if queued_requests >= config.max_waiting:
        raise QueueFullError(
            f"the server is at capacity ({config.max_waiting} requests waiting)",
            retry_after(excess_requests=queued_requests - config.max_waiting + 1))
    cap = config.max_num_queued_tokens
    if cap is None:
        return
    queued = line_tokens + sum(inbox_tokens[max(0, free_seats - waiting):])
    if queued > 0 and queued + request_tokens > cap:
        raise QueueFullError(
            f"the server is at capacity ({queued} prompt tokens waiting; "
            f"--max-num-queued-tokens {cap})",
            retry_after(excess_tokens=queued + request_tokens - cap))


def check_samples(config: EngineConfig, n: int) -> None:
    """ValueError if one prompt's n samples could never all be seated at once."""
    if n > config.max_num_seqs:
        raise ValueError(f"n={n} samples need more than the {config.max_num_seqs} seats")


class LineTracker:
    """Admission's view of the line, for an engine that takes requests in between steps.

    Its owner guards it with its lock (other threads admit while the engine thread steps):
    `check` refuses a request while the line is full, `joined` counts the requests taken
    in since the last step, and `step_ended` replaces the line with the core's after a step
    and says what joined it meanwhile, for the drain rate's `observe`."""

    def __init__(self) -> None:
        self.drain_rate = DrainRate()
        self._line = LineSize()  # the core's waiting line after the last step
        self._joined = LineSize()  # requests moved from the intake since the last step

    def check(self, config: EngineConfig, request_tokens: int, running: int, waiting: int,
              inbox_tokens: Sequence[int]) -> None:
        """check_line over the core's counts, with the intake (accepted, not taken in yet)
        in `inbox_tokens`; what joined the core's line since the last step's end is counted
        with the line's tokens."""
        check_line(config, request_tokens, running, waiting, inbox_tokens,
                   self._line.tokens + self._joined.tokens, self.drain_rate.retry_after)

    def joined(self, prompt_tokens: Sequence[int]) -> None:
        """Requests taken in by the core: counted as in the line until the step's end
        measures it."""
        self._joined.requests += len(prompt_tokens)
        self._joined.tokens += sum(prompt_tokens)

    def step_ended(self, line: LineSize) -> LineSize:
        """The core's line after a step; returns what joined it since the previous one."""
        joined, self._joined, self._line = self._joined, LineSize(), line
        return joined
