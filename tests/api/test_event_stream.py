"""SSE events as sent (api/event_stream.py): the bytes sse-starlette would write, and its
response's pings, headers and send timeout, kept without a timeout scope per event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from pydantic import BaseModel
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import SendTimeoutError

from api.event_stream import DONE, EventStream, named_sse, sse
from api.openai.bodies import CompletionChoice, CompletionStreamResponse


class Named(BaseModel):
    type: str = "response.output_text.delta"
    delta: str


TEXTS = ["plain", 'a "quote" and a \\ backslash', "line\nbreak\r\nand\rreturn",
         "é ü 中文 \u2028 \U0001f600", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_events_are_the_bytes_sse_starlette_writes(text: str) -> None:
    chunk = CompletionStreamResponse(id="cmpl-1", created=1, model="m", choices=[
        CompletionChoice(index=0, text=text, finish_reason=None)])
    assert sse(chunk) == ensure_bytes({"data": chunk.model_dump_json()}, "\r\n")
    named = Named(delta=text)
    assert named_sse(named) == ensure_bytes({"event": named.type,
                                             "data": named.model_dump_json()}, "\r\n")
    assert named_sse(named, "error") == ensure_bytes({"event": "error",
                                                      "data": named.model_dump_json()}, "\r\n")
    assert ensure_bytes({"data": "[DONE]"}, "\r\n") == DONE


async def events(pause: float) -> AsyncIterator[bytes]:
    yield sse(Named(delta="one"))
    await asyncio.sleep(pause)
    yield DONE


async def get(response: EventStream) -> httpx.Response:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await response(scope, receive, send)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/")


def test_stream_keeps_the_headers_and_the_pings() -> None:
    response = asyncio.run(get(EventStream(events(0.35), ping=0.1,
                                           headers={"X-Request-Id": "abc"})))
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["x-request-id"] == "abc"
    body = response.content
    assert body.startswith(sse(Named(delta="one"))) and body.endswith(DONE)
    assert body.count(b": ping - ") >= 2


def test_no_timeout_scope_per_event_without_a_send_timeout(monkeypatch) -> None:
    """Also a check that the library still sends through _send_with_timeout (were it to
    stop, the override would silently do nothing, and scopes would be counted here)."""
    scopes = []
    move_on_after = anyio.move_on_after

    def counting(*args: Any, **kwargs: Any) -> Any:
        scopes.append(args)
        return move_on_after(*args, **kwargs)

    monkeypatch.setattr(anyio, "move_on_after", counting)
    asyncio.run(get(EventStream(events(0), ping=0)))
    assert scopes == []
    asyncio.run(get(EventStream(events(0), ping=0, send_timeout=5)))
    assert len(scopes) == 2  # one per event: the timeout is still applied when set


def test_a_send_timeout_still_fires() -> None:
    async def stuck_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await asyncio.sleep(10)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "GET", "headers": []}
    response = EventStream(events(0), ping=0, send_timeout=0.05)
    with pytest.raises(SendTimeoutError):
        asyncio.run(response(scope, receive, stuck_send))
