"""bench.py's two HTTP clients read the same streams the same way: a tiny HTTP/1.1 server
on a real socket sends a chunked SSE stream (an event split across chunks, a comment, the
usage chunk, [DONE]) or an error status, and each client's UserResult must match."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.bench import stream_completion
from benchmarks.stream_client import CLIENTS, open_client, run_with


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


USAGE = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
# One stream as the server writes it: each piece is one HTTP chunk.
PIECES = [event("Hello")[:9], event("Hello")[9:] + b": a comment\n\n", event(","),
          event(" world") + USAGE, b"data: [DONE]\n\n"]


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    payload = json.loads(await reader.readexactly(length))
    if payload.get("prompt") == "bad":
        body = b'{"error": {"message": "no such thing"}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        for piece in PIECES:  # each its own chunk, sent apart
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


async def stream_both_ways(kind: str) -> list[tuple[str, int, str | None]]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    async with server, open_client(kind, 4, 30.0) as client:
        out = []
        for prompt in ("fine", "bad"):
            res = await stream_completion(client, url, {"prompt": prompt}, 30.0)
            out.append((res.text, res.tokens, res.error))
        return out


@pytest.mark.parametrize("kind", CLIENTS)
def test_each_client_reads_text_usage_and_errors(kind: str) -> None:
    assert run_with(kind, stream_both_ways(kind)) == [
        ("Hello, world", 3, None),
        ("", 0, 'HTTP 400: {"error": {"message": "no such thing"}}'),
    ]


def test_an_unknown_client_is_refused() -> None:
    async def attempt() -> None:
        async with open_client("curl", 1, 1.0):
            pass

    with pytest.raises(ValueError, match="unknown client 'curl'"):
        asyncio.run(attempt())


def test_the_structured_benchmark_streams_through_the_same_reader() -> None:
    import httpx

    from benchmarks import structured

    async def level() -> list[tuple[str, str | None]]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        async with server, httpx.AsyncClient() as client:
            results, _ = await structured.level(client, url, [{"prompt": "fine"}] * 2, 30.0)
        return [(r.text, r.error) for r in results]

    assert asyncio.run(level()) == [("Hello, world", None)] * 2
