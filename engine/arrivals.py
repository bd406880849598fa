"""Users who arrive together start together.

When an idle engine gets a request, it would start a step for it at once, and the users who
sent their requests at the same moment (a burst after a quiet spell: a load test's start, a
batch job, a page that fires several calls) arrive a few milliseconds later, while the HTTP
process parses and tokenizes them, and wait for the whole of that first step
(docs/engine-process.md, *A burst after an idle spell*).

The HTTP process knows how many requests it has taken in and not yet handed to the engine:
each request carries that count (`Request.arrivals_behind`): requests being checked and
tokenized when it was handed over. After an idle spell the engine takes in requests until the
last one says none is behind it, for at most --burst-wait-ms (50 ms), then steps. A request
that nothing follows waits for nothing; one announced that then fails its checks costs the
engine that wait once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.005  # how long one wait for the next request lasts before `behind` is read again


def gather(behind: Callable[[], int], take: Callable[[float], None], limit_s: float) -> None:
    """While behind() (requests announced, not yet taken in) is above zero, and for at most
    `limit_s`, call take(seconds): wait up to that long for more, and take them in."""
    end = time.monotonic() + limit_s
    while behind() > 0 and (left := end - time.monotonic()) > 0:
        take(min(POLL_S, left))
