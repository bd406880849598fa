"""The load generator's HTTP side: one streamed POST, read line by line.

Two clients, chosen with bench.py's `--client`:

- `httpx` (the default): the client of every comparison saved before `--client` existed.
- `aiohttp`, on uvloop: the same requests and the same parsing, with less CPU per streamed
  token (its HTTP parser is C, its event loop libuv). On a 2-core machine whatever the load
  generator spends is taken from the server it measures, and a one-user stream is where
  that shows: see docs/engine-process.md, "The load generator's share".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx

CLIENTS = ("httpx", "aiohttp")
T = TypeVar("T")


@dataclass
class Reply:
    """A response whose body is still to come: its status, the whole body (for an error)
    or its lines, without their line endings."""

    status: int
    body: Callable[[], Awaitable[bytes]]
    lines: AsyncIterator[str]


class StreamClient(Protocol):
    def stream(self, url: str, payload: dict[str, Any]) -> AbstractAsyncContextManager[Reply]:
        """POST `payload` as JSON to `url`; the reply, open while the context is."""
        ...


class HttpxStreams:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    @asynccontextmanager
    async def stream(self, url: str, payload: dict[str, Any]) -> AsyncIterator[Reply]:
        async with self.client.stream("POST", url, json=payload) as resp:
            yield Reply(resp.status_code, resp.aread, resp.aiter_lines())


class AiohttpStreams:
    def __init__(self, session: Any) -> None:  # an aiohttp.ClientSession
        self.session = session

    @asynccontextmanager
    async def stream(self, url: str, payload: dict[str, Any]) -> AsyncIterator[Reply]:
        async with self.session.post(url, json=payload) as resp:
            yield Reply(resp.status, resp.read, _lines(resp.content))


async def _lines(content: Any) -> AsyncIterator[str]:
    """An aiohttp body's lines (it yields them with their b"\\n")."""
    async for raw in content:
        yield raw.decode().rstrip("\r\n")


@asynccontextmanager
async def open_client(kind: str, connections: int, timeout: float) -> AsyncIterator[StreamClient]:
    """A client of `kind` (one of CLIENTS) keeping up to `connections` open at once."""
    if kind == "httpx":
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout)) as client:
            yield HttpxStreams(client)
    elif kind == "aiohttp":
        import aiohttp

        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(  # read_bufsize: lines up to 1 MiB (logprobs chunks)
                connector=connector, timeout=aiohttp.ClientTimeout(total=timeout),
                read_bufsize=2**20) as session:
            yield AiohttpStreams(session)
    else:
        raise ValueError(f"unknown client {kind!r}; expected one of {', '.join(CLIENTS)}")


def run_with(kind: str, main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the event loop that goes with the client: uvloop for aiohttp."""
    if kind == "aiohttp":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
