"""Call an ASGI app in-process and stream back what it sends.

A replica serves a forwarded HTTP request with the very app `server.py` serves (api/app.py),
so validation, error envelopes and SSE framing are the single server's. httpx's ASGI
transport would buffer the whole body; this yields each ASGI message as the app sends it,
and tells the app the client left when the caller stops reading (so the engine aborts).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

ASGIApp = Any  # an ASGI 3 callable: app(scope, receive, send)
APP_EXIT_GRACE_SECONDS = 5.0


@dataclass
class ForwardedRequest:
    """One HTTP request as the ingress passes it to a replica. `routing_text` is the prompt
    text the router matches on (deploy/prefix_router.py); the replica ignores it."""

    method: str
    path: str
    query_string: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    routing_text: str = ""


def http_scope(request: ForwardedRequest) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": request.method, "scheme": "http",
            "path": request.path, "raw_path": request.path.encode(),
            "query_string": request.query_string, "root_path": "",
            "headers": request.headers, "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0)}


async def call_asgi(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[dict[str, Any]]:
    """The app's `http.response.start` and `http.response.body` messages, as sent."""
    sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    client_gone = asyncio.Event()
    body_delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal body_delivered
        if not body_delivered:
            body_delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await client_gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await sent.put(message)

    task = asyncio.create_task(app(http_scope(request), receive, send))
    task.add_done_callback(lambda _: sent.put_nowait(None))
    try:
        while (message := await sent.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body"):
                break
    finally:
        client_gone.set()  # a no-op once the response is complete
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, APP_EXIT_GRACE_SECONDS)
