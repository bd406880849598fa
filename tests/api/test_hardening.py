"""The server under bursts, deadlines and wrong methods (fixtures in conftest.py)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from benchmarks.live_server import DONE, sse_events
from engine.admission import QueueFullError
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.request import Request, SamplingParams
from tests.api.conftest import RunningServer

COMPLETIONS = "/v1/completions"
LONG = {"prompt": "Tell me a long story.", "max_tokens": 300, "ignore_eos": True,
        "temperature": 0}


def envelope(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, f"{r.status_code} {r.text}"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def idle_blocks(server: RunningServer) -> int:
    """blocks_used once every request has left (waits up to 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = server.engine.stats()
        if stats["running"] == stats["waiting"] == 0:
            break
        time.sleep(0.05)
    return server.engine.stats()["blocks_used"]


# --- 405 and 404 ----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("POST", "/health", "GET"), ("GET", "/v1/completions", "POST"),
    ("DELETE", "/v1/chat/completions", "POST"), ("PUT", "/metrics", "GET"),
])
def test_wrong_method_405_with_allow(server, method, path, allowed):
    r = httpx.request(method, server.url + path, timeout=10)
    print(method, path, r.status_code, r.headers.get("allow"), r.text)
    assert envelope(r, 405)["type"] == "invalid_request_error"
    assert r.headers["Allow"] == allowed


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/v1/models/default", "/metrics"])
def test_head_answers_where_get_does(server, path):
    """Uptime monitors probe with HEAD: GET's status and headers, no body."""
    got, head = httpx.get(server.url + path, timeout=10), httpx.head(server.url + path, timeout=10)
    print(path, got.status_code, head.status_code, head.headers)
    assert head.status_code == got.status_code == 200
    assert head.headers["content-type"] == got.headers["content-type"] and head.content == b""


def test_models_slash_is_the_list(server):
    r = httpx.get(server.url + "/v1/models/", timeout=10, follow_redirects=True)
    assert r.status_code == 200 and r.json()["object"] == "list"
    r = httpx.get(server.url + "/v1/models?limit=0", timeout=10)  # Anthropic's: 1 to 1000
    print(r.text)
    assert envelope(r, 400)["param"] == "limit" and "'limit'" in r.json()["error"]["message"]


def test_unknown_model_404(server):
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": "Hi", "model": "gpt-4"},
                   timeout=10)
    error = envelope(r, 404)
    print(error)
    assert error["code"] == "model_not_found" and error["param"] == "model"


# --- deadlines ------------------------------------------------------------------------------


# How late a deadline may end its request: the engine checks deadlines between steps (tens
# of ms on this model), then the 504 crosses the event loop; 1 s leaves room for a busy
# machine and is still far below the ~20 s the request below would otherwise take.
DEADLINE_MARGIN_S = 1.0


def test_deadline_non_streamed_504(server):
    deadline = 0.5
    body = {**LONG, "max_tokens": 1000, "request_timeout": deadline}  # ~20 s to finish
    start = time.monotonic()
    r = httpx.post(server.url + COMPLETIONS, json=body, timeout=30)
    took = time.monotonic() - start
    error = envelope(r, 504)
    print(f"{took:.2f} s: {error}")
    assert error["type"] == "timeout_error" and error["code"] == "request_timeout"
    assert "0.5 s" in error["message"]
    assert took < deadline + DEADLINE_MARGIN_S  # ended by its deadline, not its tokens
    assert idle_blocks(server) == 0


def test_deadline_streamed_error_event(server):
    events = []
    with httpx.stream("POST", server.url + COMPLETIONS,
                      json={**LONG, "stream": True, "request_timeout": 0.7}, timeout=30) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    tokens = events[:-2]
    print(f"{len(tokens)} token events, then {events[-2:]}")
    assert events[-1] == DONE
    error = events[-2]["error"]
    assert error["type"] == "timeout_error" and error["code"] == "request_timeout"
    # Tokens came before the deadline (the first takes well under 0.7 s), then it ended
    # the stream long before its 300.
    assert all("choices" in t for t in tokens) and 1 <= len(tokens) < 300
    assert idle_blocks(server) == 0


@pytest.mark.parametrize("value", [0, -1, "soon", float("nan"), 5e-324, 0.0009], ids=str)
def test_bad_deadline_400(server, value):
    body = json.dumps({"prompt": "Hi", "request_timeout": value}, allow_nan=True)
    r = httpx.post(server.url + COMPLETIONS, content=body,
                   headers={"content-type": "application/json"}, timeout=10)
    error = envelope(r, 400)
    print(value, error)
    assert error["param"] == "request_timeout"
    if isinstance(value, float) and 0 < value < 0.001:  # below the shortest deadline
        assert "0.001" in error["message"]


def test_engine_deadline_shorter_wins(model, tokenizer):
    """--request-timeout and a request's own deadline: whichever is shorter ends it."""
    engine = BatchEngine(EngineConfig(num_blocks=32, request_timeout=0.2), model, tokenizer)
    outputs: dict[str, list] = {"server": [], "own": []}
    params = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    ids = tokenizer("Hello").input_ids
    engine.add_request(Request("server", ids, params, outputs["server"].append, timeout=5.0))
    engine.add_request(Request("own", ids, params, outputs["own"].append, timeout=0.05))
    while engine.has_work():
        engine.step()
    for name, outs in outputs.items():
        print(name, outs[-1].finish_reason, outs[-1].error, len(outs), "outputs")
        assert outs[-1].finish_reason == "timeout"
    assert "0.2 s" in outputs["server"][-1].error and "0.05 s" in outputs["own"][-1].error
    assert engine.stats()["blocks_used"] == 0


# --- admission under a burst ----------------------------------------------------------------


def test_burst_admitted_up_to_free_seats_plus_waiting(model, tokenizer):
    """Before any step runs, a burst sits in the intake line: free seats + --max-waiting of
    it get in (here 2 + 2), the rest are refused."""
    engine = BatchEngine(EngineConfig(num_blocks=32, max_num_seqs=2, max_waiting=2), model,
                         tokenizer)
    admitted, refused = 0, 0
    for i in range(20):
        try:
            engine.add_request(Request(str(i), [1, 2, 3], SamplingParams(max_tokens=1),
                                       lambda _: None))
            admitted += 1
        except QueueFullError:
            refused += 1
    print(f"admitted {admitted}, refused {refused}")
    assert (admitted, refused) == (4, 16)


def test_burst_over_http(small_server):
    """One seat and a waiting line of two: at least 3 of a burst of 12 are served (all of
    them if requests ended before the burst did), the rest get 429 at once."""
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=small_server.url, timeout=60) as client:
            return await asyncio.gather(*(client.post(COMPLETIONS, json={
                "prompt": f"Count to ten, take {i}:", "max_tokens": 8, "ignore_eos": True,
                "temperature": 0}) for i in range(12)))

    results = asyncio.run(burst())
    statuses = [r.status_code for r in results]
    print("statuses", statuses)
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) >= 3
    for r in results:
        if r.status_code == 200:
            assert r.json()["usage"]["completion_tokens"] == 8
    assert idle_blocks(small_server) == 0
