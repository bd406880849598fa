"""Huge requests are refused quickly, without stalling other streams or keeping memory.

A server with --max-request-bytes of 4 MiB serves one long stream while bodies over the
limit (413), under it but with a prompt far beyond the context (400 from the length bound,
before tokenizing) and just within the length bound (400 after tokenizing, on a worker
thread) arrive. Each answer must come within REFUSAL_S, the stream must keep its events
(no gap above MAX_GAP_S), and the process must not keep the bodies (RSS within RSS_SLACK).
"""

from __future__ import annotations

import gc
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.limits import MAX_JSON_BYTES_PER_CHAR, PromptBound, default_max_request_bytes
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from model.memory import give_back_freed_memory
from tests.api.conftest import RunningServer, serve
from tests.api.test_hardening import envelope

LIMIT = 4 << 20
REFUSAL_S = 2.0  # the server's whole answer to one refused request
# A decode step of this model takes tens of ms; before the limits, a 3 MB prompt held the
# event loop (and so every stream) for over a second while it was tokenized.
MAX_GAP_S = 1.0
RSS_SLACK = 64 << 20  # bodies of up to 8 MB come and go; none may stay


@pytest.fixture(scope="module")
def limited_server(model, tokenizer) -> Iterator[RunningServer]:
    engine = BatchEngine(EngineConfig(num_blocks=128, max_num_seqs=4), model, tokenizer)
    yield from serve(engine, max_request_bytes=LIMIT)


def rss_bytes() -> int:
    """This process's resident memory (the server runs in it, on a thread), once the heap's
    freed pages are handed back: what earlier tests in this process left freed but mapped
    would otherwise come and go with the allocator's reuse, and blur the growth measured."""
    gc.collect()
    give_back_freed_memory()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class Stream(threading.Thread):
    """A long completion stream, noting when each event arrives, until `stop` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.times, self.stop = url, [], threading.Event()

    def run(self) -> None:
        body = {"prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.times.append(time.monotonic())
                if self.stop.is_set():
                    return


def timed_post(url: str, **kwargs) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    r = httpx.post(url, timeout=30, **kwargs)
    return r, time.monotonic() - start


def test_huge_requests_refused_fast_while_a_stream_flows(limited_server, tokenizer):
    url = limited_server.url
    context = limited_server.engine.max_tokens_per_request
    bound = PromptBound(tokenizer)
    assert bound.max_chars_per_token is not None  # the default model's tokenizer has one
    # Just within the length bound, but "word " is ~1 token per 5 characters: many times the
    # context, known only by tokenizing.
    within_bound = "word " * (bound.max_chars(context) // 5)
    stream = Stream(url)
    stream.start()
    while len(stream.times) < 3:  # the stream is flowing
        assert stream.is_alive()
        time.sleep(0.02)
    rss_before = rss_bytes()
    window_start = time.monotonic()
    results = {
        "declared": timed_post(url + "/v1/completions", content=b"x" * (2 * LIMIT),
                               headers={"content-type": "application/json"}),
        "chunked": timed_post(url + "/v1/completions", headers={
            "content-type": "application/json"},
            content=(b" " * (1 << 20) for _ in range(8))),  # no Content-Length
        "long prompt": timed_post(url + "/v1/completions", json={"prompt": "word " * 600_000}),
        "long chat": timed_post(url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "word " * 600_000}]}),
        "tokenized": timed_post(url + "/v1/completions", json={"prompt": within_bound}),
    }
    window_end = time.monotonic()
    time.sleep(0.3)  # an event after the window closes the last gap
    stream.stop.set()
    stream.join(timeout=10)
    rss_after = rss_bytes()

    for name, (r, took) in results.items():
        print(f"{name}: {r.status_code} in {took:.2f} s: {r.text[:200]}")
        assert took < REFUSAL_S, name
    for name in ("declared", "chunked"):
        error = envelope(results[name][0], 413)
        assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
    for name in ("long prompt", "long chat", "tokenized"):
        error = envelope(results[name][0], 400)
        assert error["param"] == ("messages" if name == "long chat" else "prompt")
        assert error["code"] == "context_length_exceeded"
        assert str(context) in error["message"]
    assert "at least" in results["long prompt"][0].json()["error"]["message"]  # the bound
    tokens = len(tokenizer(within_bound).input_ids)
    assert f"The prompt is {tokens} tokens" in results["tokenized"][0].json()["error"][
        "message"]  # counted by tokenizing, which the bound could not spare

    during = [t for t in stream.times if window_start <= t <= window_end]
    around = [t for t in stream.times if t < window_start][-1:] + during + [
        t for t in stream.times if t > window_end][:1]
    gaps = [b - a for a, b in itertools.pairwise(around)]
    print(f"{len(during)} events in the {window_end - window_start:.2f} s window, largest gap "
          f"{max(gaps):.3f} s; RSS {rss_before >> 20} -> {rss_after >> 20} MiB")
    assert len(around) >= 3 and max(gaps) < MAX_GAP_S
    assert rss_after - rss_before < RSS_SLACK


def test_a_body_at_the_limit_is_served(limited_server):
    """The limit refuses only what is over it: a body of exactly LIMIT bytes is read."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    padded = body[:-1] + b" " * (LIMIT - len(body)) + b"}"
    r = httpx.post(limited_server.url + "/v1/completions", content=padded,
                   headers={"content-type": "application/json"}, timeout=30)
    assert len(padded) == LIMIT and r.status_code == 200, r.text


def test_default_limit_fits_the_longest_prompt(tokenizer):
    """The default takes the longest prompt the length bound lets through, each character
    spelled in the most bytes JSON allows, and room for the rest of the body."""
    bound = PromptBound(tokenizer)
    limit = default_max_request_bytes(8192, bound)
    longest = bound.max_chars(8192)
    print(f"longest token {bound.max_chars_per_token} characters; default limit {limit} bytes")
    assert longest is not None
    assert limit >= longest * MAX_JSON_BYTES_PER_CHAR + (1 << 20)
    assert len(json.dumps({"prompt": "\U0001F600" * longest})) < limit  # the worst spelling
    assert limit < 30_000_000  # the 30 MB body that once took 27 s is refused


def test_length_bound_never_refuses_what_fits(tokenizer):
    """The text that packs the most characters into each token still passes the bound."""
    bound = PromptBound(tokenizer)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    longest = max(vocab, key=len)
    text = tokenizer.convert_tokens_to_string([longest]) * 50
    tokens = len(tokenizer(text).input_ids)
    print(f"{longest!r}: {len(text)} characters, {tokens} tokens, bound says at least "
          f"{bound.min_tokens(text)}")
    assert bound.min_tokens(text) <= tokens
    bound.check(text, tokens)  # fits exactly in its own count: no refusal
