"""benchmarks/live_server.py against small stand-in servers (no model): start, wait for
/health, fail fast, stop by SIGTERM then SIGKILL, the command line, and SSE parsing."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from benchmarks.live_server import (
    LiveServer,
    ServerFailed,
    async_sse_events,
    free_port,
    main,
    sse_events,
)

# A stand-in server: PORT [DELAY [ignore-term]]; waits DELAY s, then answers /health 200.
STAND_IN = """
import http.server, signal, sys, time
if sys.argv[3:] == ["ignore-term"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(float(sys.argv[2]))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def stand_in(delay: float = 0.0, *extra: str) -> list[str]:
    return [sys.executable, "-c", STAND_IN, "{port}", str(delay), *extra]


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert 0 < port < 65536


def test_waits_for_health_then_stops_by_sigterm(tmp_path) -> None:
    with LiveServer(stand_in(0.6), tmp_path / "server.log") as server:
        print(f"healthy after {server.startup_s:.2f} s on {server.url}")
        assert server.startup_s is not None and server.startup_s >= 0.6
        assert httpx.get(server.url + "/health").status_code == 200
        assert str(server.port) in server.command
    assert server.proc.returncode == -signal.SIGTERM
    assert "listening" in (tmp_path / "server.log").read_text()
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/health", timeout=2)


def test_an_exit_before_health_fails_fast_with_the_log(tmp_path) -> None:
    code = "import sys; print('no model here'); sys.exit(3)"
    server = LiveServer([sys.executable, "-c", code], tmp_path / "server.log",
                        start_timeout=60)
    began = time.monotonic()
    with pytest.raises(ServerFailed, match="exited with 3") as failed:
        server.start()
    print(failed.value)
    assert "no model here" in str(failed.value)
    assert time.monotonic() - began < 10


def test_not_healthy_in_time_fails_and_ends_the_process(tmp_path) -> None:
    server = LiveServer(stand_in(60), tmp_path / "server.log", start_timeout=1)
    with pytest.raises(ServerFailed, match="did not answer 200 within 1 s"):
        server.start()
    assert server.proc.returncode == -signal.SIGTERM


def test_sigkill_once_the_grace_is_over(tmp_path) -> None:
    server = LiveServer(stand_in(0, "ignore-term"), tmp_path / "server.log", stop_grace=0.5)
    with server:
        pass
    assert server.proc.returncode == -signal.SIGKILL


def test_the_command_runs_a_client_while_the_server_is_up(tmp_path, capfd) -> None:
    client = [sys.executable, "-c", "import os, sys; print(sys.argv[1], os.environ['SERVER_URL'],"
              " os.environ['SERVER_STARTUP_S']); sys.exit(int(sys.argv[2]))", "{url}"]
    log = str(tmp_path / "server.log")
    assert main(["--log", log, *stand_in(), "--", *client, "0"]) == 0
    url, url_again, startup = capfd.readouterr().out.split()
    assert url.startswith("http://127.0.0.1:") and url == url_again and float(startup) >= 0
    assert main(["--log", log, *stand_in(), "--", *client, "7"]) == 7
    assert main(["--log", log, "--allow-client-failure", *stand_in(), "--", *client, "7"]) == 0
    failing = [sys.executable, "-c", "raise SystemExit(2)"]
    assert main(["--log", log, *failing, "--", *client, "0"]) == 1
    assert "exited with 2" in capfd.readouterr().err


LINES = ['data: {"a": 1}', "", ": ping - a comment", "", "event: x", "data: [1,", "data: 2]",
         "", "data:[DONE]"]  # the last event is left open by the end of the stream
EVENTS = [{"a": 1}, [1, 2], "[DONE]"]


def test_sse_events_join_data_lines_and_skip_the_rest() -> None:
    assert list(sse_events(LINES)) == EVENTS


def test_async_sse_events_agree() -> None:
    async def lines() -> AsyncIterator[str]:
        for line in LINES:
            yield line

    async def collect() -> list:
        return [event async for event in async_sse_events(lines())]

    assert asyncio.run(collect()) == EVENTS
