"""What one request may weigh: its body in bytes, and its prompt before it is tokenized.

A body over --max-request-bytes is refused with 413 before it is read whole: at once when
its Content-Length says so, else as soon as the bytes received pass the limit (a chunked
upload). Nothing of it is kept. The default follows from the longest prompt the server can
hold (`default_max_request_bytes`).

A prompt too long to fit is refused before the tokenizer sees it when its length alone
proves it (`PromptBound`), so a huge text costs no tokenization time or memory.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import APIError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# JSON may spell one character (a Python str's code point) in up to 12 bytes: an astral
# character as two \uXXXX escapes. No text of a given length can take more.
MAX_JSON_BYTES_PER_CHAR = 12
# Room for everything in a body but its prompt: sampling fields, a structured output's schema,
# a logit_bias over much of the vocabulary (~15 bytes per entry).
BODY_OVERHEAD_BYTES = 1 << 20
# After a 413, the rest of the upload is read and dropped (so the client reads the answer
# rather than a reset connection), up to this much; past it the connection is closed.
MAX_DRAIN_BYTES = 64 << 20


class PromptBound:
    """The fewest tokens a text can become, from its length alone.

    Each token of the vocabulary stands for at most `max_chars_per_token` characters: the
    longest token's string (for byte-level BPE each of its characters is one byte of text,
    and a character takes at least one byte). The tokenizer covers the whole text with
    tokens, so a text of C characters becomes at least ceil(C / max_chars_per_token) tokens.
    That holds when the tokenizer does not first rewrite the text (a normalizer could
    shorten it, NFKC say): with one, or without a fast tokenizer to inspect, there is no
    bound (`max_chars_per_token` None) and every prompt is tokenized."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.max_chars_per_token = longest_token_chars(tokenizer)

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens `text` becomes (0 when there is no bound)."""
        if self.max_chars_per_token is None:
            return 0
        return math.ceil(len(text) / self.max_chars_per_token)

    def max_chars(self, max_tokens: int) -> int | None:
        """The longest text that may still fit in `max_tokens` (None: no bound)."""
        if self.max_chars_per_token is None:
            return None
        return max_tokens * self.max_chars_per_token

    def check(self, text: str, max_tokens: int, param: str = "prompt") -> None:
        """APIError (400, context_length_exceeded) if `text` cannot fit in `max_tokens`."""
        least = self.min_tokens(text)
        if least > max_tokens:
            raise APIError(f"The prompt is at least {least} tokens ({len(text)} characters, "
                           f"and no token of this model stands for more than "
                           f"{self.max_chars_per_token}); this server holds at most "
                           f"{max_tokens} tokens per request (prompt + completion).", param,
                           code="context_length_exceeded")


def longest_token_chars(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The most characters any one token stands for; None if that cannot be known."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return None
    vocab = backend.get_vocab(with_added_tokens=True)
    return max(len(token) for token in vocab) if vocab else None


def default_max_request_bytes(max_tokens_per_request: int, bound: PromptBound) -> int:
    """The largest body a request that could fit may need: its longest prompt with every
    character spelled in the most JSON bytes, plus BODY_OVERHEAD_BYTES for the rest."""
    chars = bound.max_chars(max_tokens_per_request)
    if chars is None:  # no bound from the vocabulary: allow a generous 64 characters a token
        chars = max_tokens_per_request * 64
    return chars * MAX_JSON_BYTES_PER_CHAR + BODY_OVERHEAD_BYTES


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-request-bytes", type=int, default=None, metavar="BYTES",
                        help="refuse request bodies larger than this with HTTP 413 (default: "
                             "what the longest prompt that fits the context can take, "
                             "about 9 MB for the default model)")


def check_max_request_bytes(value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError("--max-request-bytes must be at least 1")


class BodySizeLimit:
    """ASGI middleware: 413 in the route's error shape for a body over `max_bytes`, before the app
    reads any of it; the app gets the body whole, from memory, once it is known to fit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.refuse(send, receive, f"is {declared} bytes", scope["path"])
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                await self.app(scope, replay(message, receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                chunks.clear()
                await self.refuse(send, receive, f"is over {self.max_bytes} bytes",
                                  scope["path"], more=message.get("more_body", False))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole = replay({"type": "http.request", "body": b"".join(chunks)}, receive)
        chunks.clear()  # only `whole` holds the body now, until the app has read it
        await self.app(scope, whole, send)

    async def refuse(self, send: Send, receive: Receive, size: str, path: str,
                     more: bool = True) -> None:
        message = (f"The request body {size}; this server takes at most {self.max_bytes} "
                   "bytes (--max-request-bytes).")
        error = APIError(message, status=413, code="request_too_large")
        payload = error.body_for(path).model_dump_json().encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        drained = 0
        while more and drained <= MAX_DRAIN_BYTES:  # read and drop the rest
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)


def content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def replay(first: Message, receive: Receive) -> Receive:
    """A receive that returns `first`, then whatever `receive` brings (a later disconnect,
    which the app watches for). It lets go of `first` once returned."""
    pending = [first]
    del first

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
