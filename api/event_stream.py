"""Server-sent events: how a stream's messages are written, and the response that sends them.

Every streamed token is one event, so what each event costs on the event loop is paid per
token. Events are encoded here straight to the bytes sse-starlette would write for
`{"data": json}` (a message's JSON is one line, so it is one `data:` field), and
EventStream skips the per-send timeout scope that no deadline needs.
"""

from __future__ import annotations

from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse
from starlette.types import Message, Send

SEP = b"\r\n"  # sse-starlette's default line separator
DONE = b"data: [DONE]" + SEP + SEP  # the last event of an OpenAI stream


def sse(message: BaseModel) -> bytes:
    """One unnamed event: `data: JSON`."""
    return b"data: " + message.model_dump_json().encode() + SEP + SEP


def named_sse(message: BaseModel, name: str | None = None) -> bytes:
    """One event named `name` (by default the message's `type`), as the Responses and
    Messages APIs send them: `event: NAME` before its data."""
    name = message.type if name is None else name  # type: ignore[attr-defined]
    return (b"event: " + name.encode() + SEP + b"data: " + message.model_dump_json().encode()
            + SEP + SEP)


class EventStream(EventSourceResponse):
    """sse-starlette's response (pings, disconnect and shutdown handling, headers), sending
    without a timeout scope when it has no send_timeout.

    The library opens an anyio `move_on_after(send_timeout)` around every send, also when
    the timeout is None, where the scope can never fire: one scope per event, which on a
    busy server was a large part of the event loop's time per token."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)
