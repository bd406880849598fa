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
from dataclasses import dataclass

DEFAULT_RETRY_AFTER = 1  # seconds, while nothing has been measured yet
MAX_RETRY_AFTER = 60


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
        if self._busy_seconds == 0:
            return DEFAULT_RETRY_AFTER
        seconds = 0.0
        for excess, rate in ((excess_requests, self.requests_per_second),
                             (excess_tokens, self.tokens_per_second)):
            if excess > 0:
                seconds = max(seconds, excess / rate if rate else math.inf)
        return int(min(max(math.ceil(seconds - 1e-6), 1), MAX_RETRY_AFTER))  # float dust
