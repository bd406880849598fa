"""A server under measurement: its process on a loopback port, and the events it streams.

`LiveServer` starts a command (server.py, baseline_server.py, another checkout's server.py,
llama.cpp's llama-server) with "{port}" in its arguments replaced by a free port and its
output in a log file, waits until GET /health answers 200 (failing at once, with the log's
last lines, if the process exits first), and stops it by its own pid: SIGTERM, a grace
period, then SIGKILL. `sse_events` and `async_sse_events` turn a streamed response's lines
into its events' parsed data.

As a command, it runs a client while the server is up and stops the server afterwards:

    python3 -m benchmarks.live_server [--port N] [--log FILE] [--cwd DIR] \\
        SERVER COMMAND... [-- CLIENT COMMAND...]

e.g. `python3 -m benchmarks.live_server python3 server.py --port {port} -- python3
benchmarks/bench.py --url {url} --users 1`. "{port}" and "{url}" in the client's arguments
are replaced too, and it gets SERVER_URL, SERVER_PORT and SERVER_STARTUP_S (seconds from
the start to the first healthy answer) in its environment. The exit status is the client's
(0 with --allow-client-failure), 1 if the server did not come up. Without a client command
the server runs until it exits or this command is interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

HOST = "127.0.0.1"
DONE = "[DONE]"  # the data of an OpenAI stream's last event


def free_port() -> int:
    """A loopback TCP port that no one listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    """The server exited before it was healthy, or was not healthy in time."""


class LiveServer:
    """One server process on HOST; a context manager (start on enter, stop on exit)."""

    def __init__(self, command: Sequence[str], log: Path | str | None = None, *,
                 port: int | None = None, cwd: Path | str | None = None,
                 env: dict[str, str] | None = None, start_timeout: float = 300.0,
                 stop_grace: float = 60.0) -> None:
        self.port = port or free_port()
        self.command = [arg.replace("{port}", str(self.port)) for arg in command]
        self.log = Path(log) if log else (Path(tempfile.gettempdir())
                                           / f"nano-vllm-server-{self.port}.log")
        self.cwd, self.env = cwd, env
        self.start_timeout, self.stop_grace = start_timeout, stop_grace
        self.startup_s: float | None = None  # from the start to the first healthy answer
        self._proc: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def proc(self) -> subprocess.Popen:
        if self._proc is None:
            raise RuntimeError("the server was not started")
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> LiveServer:
        """Start the command and return once /health answers 200."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("wb")
        began = time.monotonic()
        self._proc = subprocess.Popen(self.command, cwd=self.cwd, env=self.env,
                                      stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy(began + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        return self

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise ServerFailed(f"{self.command[0]} exited with {self.proc.returncode} "
                                   f"before it was healthy; {self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerFailed(f"{self.url}/health did not answer 200 within "
                                   f"{self.start_timeout:g} s; {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"last lines of {self.log}:\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float | None = None) -> int:
        """SIGTERM, wait up to `grace` seconds (default: stop_grace), then SIGKILL; the exit
        status (negative: the signal that ended it). Does nothing more once it has exited."""
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace if grace is None else grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return proc.returncode

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --- server-sent events --------------------------------------------------------------------


class _EventAssembler:
    """The data lines of one event, joined with newlines as SSE does; fields other than
    data (event, id, retry) and comments are passed over."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def line(self, line: str) -> str | None:
        """Take one line; the event's data once a blank line ends it."""
        if line.startswith("data:"):
            self.data.append(line[5:].removeprefix(" "))
            return None
        return self.end() if not line else None

    def end(self) -> str | None:
        data, self.data = self.data, []
        return "\n".join(data) if data else None


def parse_data(data: str) -> Any:
    """An event's data: DONE as it is, anything else as JSON."""
    return data if data == DONE else json.loads(data)


def sse_events(lines: Iterable[str]) -> Iterator[Any]:
    """The parsed data of each event in a stream's lines (httpx's `iter_lines()`); an event
    left open when the stream ends counts too."""
    event = _EventAssembler()
    for line in lines:
        if (data := event.line(line)) is not None:
            yield parse_data(data)
    if (data := event.end()) is not None:
        yield parse_data(data)


async def async_sse_events(lines: AsyncIterable[str]) -> AsyncIterator[Any]:
    """`sse_events` for an async stream's lines (httpx's `aiter_lines()`)."""
    event = _EventAssembler()
    async for line in lines:
        if (data := event.line(line)) is not None:
            yield parse_data(data)
    if (data := event.end()) is not None:
        yield parse_data(data)


# --- command line --------------------------------------------------------------------------


def split_commands(words: list[str]) -> tuple[list[str], list[str]]:
    """SERVER... [-- CLIENT...] into the two commands."""
    if "--" not in words:
        return words, []
    at = words.index("--")
    return words[:at], words[at + 1:]


def run_client(server: LiveServer, client: list[str]) -> int:
    """The client's exit status, run while the server is up."""
    args = [a.replace("{url}", server.url).replace("{port}", str(server.port)) for a in client]
    env = {**os.environ, "SERVER_URL": server.url, "SERVER_PORT": str(server.port),
           "SERVER_STARTUP_S": f"{server.startup_s:.1f}"}
    return subprocess.run(args, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Start a server, wait for /health, run a client, stop the server.",
        usage="%(prog)s [options] SERVER COMMAND... [-- CLIENT COMMAND...]")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--log", type=Path, default=None, help="the server's output")
    parser.add_argument("--cwd", type=Path, default=None, help="the server's directory")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to be healthy")
    parser.add_argument("--grace", type=float, default=60, help="seconds from SIGTERM to KILL")
    parser.add_argument("--allow-client-failure", action="store_true",
                        help="exit 0 when the client fails (only a server that does not "
                             "come up fails)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    server_command, client = split_commands(args.command)
    if not server_command:
        parser.error("no server command")
    # A SIGTERM to this command stops the server too (the context manager's exit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    server = LiveServer(server_command, args.log, port=args.port, cwd=args.cwd,
                        start_timeout=args.timeout, stop_grace=args.grace)
    try:
        with server:
            print(f"healthy after {server.startup_s:.1f} s: {server.url} "
                  f"(log: {server.log})", file=sys.stderr, flush=True)
            if not client:
                return server.proc.wait()
            status = run_client(server, client)
    except ServerFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if status and args.allow_client_failure:
        print(f"the client exited with {status}; going on", file=sys.stderr)
        return 0
    return status


if __name__ == "__main__":
    raise SystemExit(main())
