"""GET /dashboard over real HTTP: the page, its event stream of engine snapshots while
requests share a prefix, a block's tooltip details, and errors in OpenAI's envelope."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.live_server import sse_events
from tests.api.conftest import MODEL_NAME, RunningServer
from tests.api.dashboard_load import PREFIX, QUESTIONS, shared_prefix_streams


def frames(server: RunningServer, until: Callable[[dict[str, Any]], bool],
           timeout: float = 60) -> dict[str, Any]:
    """Read /dashboard/events until a message satisfies `until`; return that message."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=timeout) as client, client.stream(
            "GET", f"{server.url}/dashboard/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for message in sse_events(response.iter_lines()):
            if until(message):
                return message
            assert time.monotonic() < deadline, "no frame like that in time"
    raise AssertionError("the event stream ended")


def test_dashboard_page_and_its_files(server):
    page = httpx.get(f"{server.url}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="pool"' in page.text and "dashboard/static/dashboard.js" in page.text
    assert "http" not in page.text.replace(server.url, ""), "no outside (CDN) links"
    js = httpx.get(f"{server.url}/dashboard/static/dashboard.js")
    assert js.status_code == 200 and "EventSource" in js.text
    css = httpx.get(f"{server.url}/dashboard/static/dashboard.css")
    assert css.headers["content-type"].startswith("text/css")
    missing = httpx.get(f"{server.url}/dashboard/static/secret.py")
    print("missing file:", missing.json())
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "name"


def test_the_model_list_and_a_model_the_server_does_not_serve(server):
    listing = httpx.get(f"{server.url}/dashboard/models").json()
    print(listing)
    assert listing == {"object": "list", "current": MODEL_NAME, "data": [
        {"id": MODEL_NAME, "state": "loaded", "kv_cache": True}]}
    for path in ("models", "events", "blocks/1"):
        refused = httpx.get(f"{server.url}/dashboard/{path}?model=gpt-5")
        assert refused.status_code == 404, path
        assert refused.json()["error"]["code"] == "model_not_found"


def shared_by_all(message: dict[str, Any]) -> bool:
    """A snapshot where every question's request is running and shares prefix blocks."""
    running = [r for r in message["frame"]["requests"] if r["status"] == "running"]
    return len(running) == len(QUESTIONS) and all(r["shared_blocks"] for r in running)


def test_events_show_shared_prefix_blocks_and_their_text(server, tokenizer):
    prompt_ids = tokenizer(PREFIX + QUESTIONS[0]).input_ids
    common = len(tokenizer(PREFIX).input_ids) - 1  # the last prefix token may merge
    with shared_prefix_streams(server.url):
        message = frames(server, shared_by_all)
        frame = message["frame"]
        shared = [b for b, ref in enumerate(frame["refs"]) if ref > 1]
        print(f"snapshot {frame['seq']} at step {frame['step']}: shared blocks {shared}, "
              f"requests {frame['requests']}")
        assert len(shared) >= common // 16 - 1
        assert {frame["refs"][b] for b in shared} == {len(QUESTIONS)}
        assert len(frame["refs"]) == frame["num_blocks"] == server.engine.core.allocator.num_blocks
        assert frame["steps"] and all(s[1] + s[2] <= frame["token_budget"] for s in frame["steps"])
        assert message["counters"]["generation_tokens"] > 0

        first = server.engine.snapshots.latest.requests[0]
        block_id = first.block_table[1]
        details = httpx.get(f"{server.url}/dashboard/blocks/{block_id}").json()
        print("block details:", details)
        assert details["state"] == "used" and details["ref_count"] == len(QUESTIONS)
        assert details["position"] == 1 and details["token_range"] == [16, 31]
        assert details["token_ids"] == prompt_ids[16:32]
        assert details["text"] == tokenizer.decode(prompt_ids[16:32]) and details["text"] in PREFIX
        assert details["hash"] and details["parent_hash"]

    def idle_with_cached_blocks(message: dict[str, Any]) -> bool:
        return not message["frame"]["requests"] and message["frame"]["cached_free"] > 0

    frame = frames(server, idle_with_cached_blocks)["frame"]
    cached = [b for b, ref in enumerate(frame["refs"]) if ref == -1]
    print(f"after the requests: {len(cached)} cached-free blocks")
    assert len(cached) == frame["cached_free"] >= common // 16
    details = httpx.get(f"{server.url}/dashboard/blocks/{cached[0]}").json()
    print("a cached-free block:", details)
    assert details["state"] == "cached" and details["ref_count"] == 0
    assert details["text"] and details["hash"] and details["position"] is not None


def test_block_errors_use_the_openai_envelope(server):
    frames(server, lambda message: True)  # a snapshot exists
    for path, status in [("0", 404), ("99999", 404), ("abc", 400)]:
        response = httpx.get(f"{server.url}/dashboard/blocks/{path}")
        print(path, response.status_code, response.json())
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_closing_the_page_stops_the_snapshots(server):
    frames(server, lambda message: True)  # open the stream, read one frame, close it
    board = server.engine.snapshots
    closed = time.monotonic()
    while board.watched and time.monotonic() - closed < 10:
        time.sleep(0.1)
    print(f"watched {time.monotonic() - closed:.2f} s after the page closed "
          f"(watch timeout {board.watch_timeout} s)")
    assert not board.watched


def test_keys_guard_the_dashboard(tokenizer):
    from tests.api.test_security import KEYS, bearer, check_401, client_for

    c = client_for(tokenizer, api_keys=KEYS)
    for path in ("/dashboard", "/dashboard/events", "/dashboard/blocks/1",
                 f"/dashboard?api_key={KEYS[0]}x"):
        check_401(c.get(path))
    assert c.get("/dashboard", headers=bearer(KEYS[0])).status_code == 200
    # A browser opening the page (and its EventSource) can send the key only in the URL.
    assert c.get(f"/dashboard?api_key={KEYS[0]}").status_code == 200
    # The page's own code is the same for everyone: not guarded.
    assert c.get("/dashboard/static/dashboard.js").status_code == 200
    # That fake engine has no paged pool to show: a clear 404, not a crash.
    r = c.get("/dashboard/events", headers=bearer(KEYS[0]))
    print(r.status_code, r.text)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert "/dashboard" not in c.get("/openapi.json").json()["paths"]
