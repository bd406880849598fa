"""A few streaming requests that share a long prefix, kept in flight while a test looks at
the dashboard (tests/api/test_dashboard*.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from benchmarks.live_server import sse_events

# ~115 tokens: seven full blocks of 16 in common before the questions differ.
PREFIX = ("You are the assistant of a small town library. The library opens at nine and "
          "closes at five, except on Sundays. Books may be borrowed for three weeks and "
          "renewed twice. Children's books are on the ground floor, novels on the first, "
          "and the reading room with newspapers and magazines on the second. Answer every "
          "question politely, in one or two sentences, and never invent opening hours, "
          "prices or rules. If a question is not about the library, say that you can only "
          "help with the library. Members pay no fee; visitors may read but not borrow. ")
QUESTIONS = ["When do you open?", "Can I renew a book?", "Where are the novels?"]


@contextmanager
def shared_prefix_streams(url: str, max_tokens: int = 400) -> Iterator[None]:
    """Stream one completion per question; the first alone until its first token (so its
    prefix blocks are cached), then the others, which share them. Closed on exit (aborting
    any still running)."""
    stop, started = threading.Event(), [threading.Event() for _ in QUESTIONS]

    def stream(i: int) -> None:
        body = {"prompt": PREFIX + QUESTIONS[i], "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True}
        with httpx.Client(timeout=120) as client, client.stream(
                "POST", f"{url}/v1/completions", json=body) as response:
            for _ in sse_events(response.iter_lines()):
                started[i].set()
                if stop.is_set():
                    break
        started[i].set()  # ended (or failed): never leave a waiter hanging

    threads = [threading.Thread(target=stream, args=(i,), daemon=True)
               for i in range(len(QUESTIONS))]
    threads[0].start()
    started[0].wait(timeout=60)
    for thread in threads[1:]:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
