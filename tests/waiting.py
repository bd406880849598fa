"""Waiting, from outside, for a server, an engine or a thread to reach a state."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float = 60.0,
             interval: float = 0.01) -> None:
    """Return once condition() is true, polling every `interval` seconds; fail the test if
    it is still false after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting ({timeout:g} s)"
        time.sleep(interval)
