"""The server's life under faults: a dead engine is visible, SIGTERM drains (a real signal to
a real server process), and an engine failure ends the process for its supervisor."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.lifecycle import ENGINE_FAILURE_EXIT_CODE
from benchmarks.live_server import LiveServer, sse_events
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from tests.api.conftest import RunningServer, serve
from tests.api.test_server import check_error
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
COMPLETIONS = "/v1/completions"
START_TIMEOUT = 240  # a first start may compile the CPU kernels (about a minute)


# --- a dead engine, in this process --------------------------------------------------------


class InjectedCrash(BaseException):
    """What the engine loop's own error handling cannot catch (it catches Exception)."""


@pytest.fixture
def doomed(model, tokenizer) -> Iterator[RunningServer]:
    yield from serve(BatchEngine(EngineConfig(num_blocks=64, max_num_seqs=4), model,
                                 tokenizer))


class StreamReader(threading.Thread):
    """Reads one streamed completion: its events (JSON or '[DONE]'), status and end time."""

    def __init__(self, url: str, body: dict) -> None:
        super().__init__()
        self.url, self.body = url, body
        self.events: list = []
        self.status: int | None = None
        self.ended: float | None = None
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", self.url + COMPLETIONS, json={**self.body, "stream": True},
                          timeout=120) as r:
            self.status = r.status_code
            for event in sse_events(r.iter_lines()):
                self.events.append(event)
        self.ended = time.monotonic()

    def texts(self) -> list[str]:
        return [e["choices"][0]["text"] for e in self.events
                if isinstance(e, dict) and e.get("choices")]

    def error(self) -> dict | None:
        return next((e["error"] for e in self.events if isinstance(e, dict) and "error" in e),
                    None)


def test_a_dead_engine_fails_its_requests_and_refuses_new_ones(doomed):
    """Kept up (the in-process app does not exit): in-flight streams end with an error
    event, /health and new requests answer 503, the failure callbacks run."""
    engine = doomed.engine
    called = threading.Event()
    engine.on_failure(called.set)
    reader = StreamReader(doomed.url, {"prompt": "Once", "max_tokens": 300, "ignore_eos": True})
    wait_for(lambda: len(reader.texts()) >= 2)

    def crash() -> None:
        raise InjectedCrash("injected by the test")

    engine.core.step = crash  # the next step kills the engine thread
    reader.join(timeout=30)
    error = reader.error()
    print(f"{len(reader.texts())} tokens, then {error}; last event {reader.events[-1]!r}")
    assert error is not None and error["code"] == "engine_failed"
    assert "InjectedCrash" in error["message"]
    assert reader.events[-1] == "[DONE]"
    assert called.wait(5) and not engine.is_alive
    health = httpx.get(doomed.url + "/health", timeout=10)
    assert check_error(health, 503, "server_error")["code"] == "service_unavailable"
    r = httpx.post(doomed.url + COMPLETIONS, json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
    error = check_error(r, 503, "server_error")
    print("new request:", error)
    assert error["code"] == "service_unavailable" and "engine failed" in error["message"]


# --- real server processes -----------------------------------------------------------------


def small_server(log: Path, *flags: str, code: str | None = None) -> LiveServer:
    """server.py (or `code`, which runs it) on a free loopback port, with a small pool."""
    argv = [sys.executable, *(["-c", code] if code else ["server.py"]), "--port", "{port}",
            "--num-blocks", "64", "--max-num-seqs", "4", *flags]
    return LiveServer(argv, log, cwd=ROOT, start_timeout=START_TIMEOUT)


def running(url: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=10).text
    return float(re.search(r"^nano_vllm:num_requests_running (\S+)$", metrics, re.M)[1])


def test_sigterm_drains_then_exits_zero(tmp_path):
    """Three requests in flight at SIGTERM, --shutdown-timeout 6: the short stream finishes
    with all its tokens, the long stream ends with an error event, the long non-streamed
    request with a 503; meanwhile /health and new requests get 503. Exit status 0, no
    request left and no block held."""
    log = tmp_path / "server.log"
    with small_server(log, "--shutdown-timeout", "6") as server:
        url, proc = server.url, server.proc
        short = StreamReader(url, {"prompt": "One", "max_tokens": 40, "ignore_eos": True})
        long = StreamReader(url, {"prompt": "Two", "max_tokens": 900, "ignore_eos": True})
        plain: dict[str, httpx.Response] = {}
        plain_thread = threading.Thread(target=lambda: plain.setdefault("r", httpx.post(
            url + COMPLETIONS, json={"prompt": "Three", "max_tokens": 900, "ignore_eos": True},
            timeout=120)))
        plain_thread.start()
        wait_for(lambda: running(url) == 3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)

        time.sleep(0.3)
        health = httpx.get(url + "/health", timeout=10)
        assert check_error(health, 503, "server_error")["message"] == (
            "The server is shutting down.")
        for path, body in ((COMPLETIONS, {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                   "content": "Hi"}]})):
            r = httpx.post(url + path, json={**body, "max_tokens": 2}, timeout=10)
            assert check_error(r, 503, "server_error")["code"] == "service_unavailable"

        for thread in (short, long, plain_thread):
            thread.join(timeout=60)
        rc = proc.wait(timeout=30)
        exited = time.monotonic()
    output = log.read_text()
    print(output)
    print(f"short: {len(short.texts())} chunks, ended {short.ended - sent:.2f} s after SIGTERM; "
          f"long: {len(long.texts())} chunks then {long.error()}, ended "
          f"{long.ended - sent:.2f} s after; plain: {plain['r'].status_code}; exit {rc} "
          f"{exited - sent:.2f} s after")
    assert short.ended > sent and short.error() is None
    assert "".join(short.texts()) and short.events[-2]["choices"][0]["finish_reason"] == "length"
    assert len(short.texts()) == 40  # one token per event: every one of them
    assert long.error() is not None and long.error()["code"] == "server_shutting_down"
    assert long.events[-1] == "[DONE]" and 5.5 < long.ended - sent < 15
    error = check_error(plain["r"], 503, "server_error")
    assert error["code"] == "server_shutting_down"
    assert rc == 0
    assert output.count("the engine core process exited with status 0") == 1  # stopped once
    counts = re.search(r"stopped: (\d+) requests in flight; KV blocks used (\d+), free (\d+), "
                       r"cached-free (\d+) of (\d+)", output)
    assert counts, output
    in_flight, used, free, cached_free, total = map(int, counts.groups())
    assert in_flight == 0 and used == 0 and free + cached_free == total


CRASHING_SERVER = """
import server, engine.core as core
class InjectedCrash(BaseException):
    pass
step = core.PagedEngineCore.step
def crashing_step(self):
    if any(r.params.max_tokens == 777 for r in self.scheduler.running):
        raise InjectedCrash("injected by the test")
    return step(self)
core.PagedEngineCore.step = crashing_step
raise SystemExit(server.main())
"""


def test_an_engine_failure_exits_non_zero_for_the_supervisor(tmp_path):
    """By default a dead engine ends the process (status 70) after failing what was in
    flight, so systemd or Kubernetes restarts it (here the engine thread of
    --no-engine-process)."""
    log = tmp_path / "server.log"
    # In-process: the patch reaches the engine thread (a core process is killed in
    # tests/api/test_engine_process.py).
    with small_server(log, "--no-engine-process", code=CRASHING_SERVER) as server:
        url, proc = server.url, server.proc
        bystander = StreamReader(url, {"prompt": "Hello", "max_tokens": 300, "ignore_eos": True})
        wait_for(lambda: len(bystander.texts()) >= 2)
        r = httpx.post(url + COMPLETIONS, json={"prompt": "Crash", "max_tokens": 777}, timeout=60)
        bystander.join(timeout=30)
        rc = proc.wait(timeout=30)
    print(log.read_text())
    print(f"crasher: {r.status_code} {r.text}; bystander: {bystander.error()}; exit {rc}")
    assert check_error(r, 503, "server_error")["code"] == "engine_failed"
    assert bystander.error() is not None and bystander.error()["code"] == "engine_failed"
    assert rc == ENGINE_FAILURE_EXIT_CODE


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_while_starting_stops_cleanly(signum, status):
    """Ctrl-C or SIGTERM while the engine core loads the model: a line saying so, not a
    traceback; SIGTERM's status is a drain's (0), Ctrl-C's the shell's 130; no core process
    is left behind."""
    proc = subprocess.Popen([sys.executable, "server.py", "--port", "0", "--num-blocks", "64"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    for line in proc.stdout:  # the core process logs its model load (relayed here)
        lines.append(line)
        if "nano_vllm.engine loading" in line:
            break
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(lines) + rest
    print(output)
    assert proc.returncode == status
    assert f"stopped while starting ({signal.Signals(signum).name})" in output
    assert "Traceback" not in output and "serving on" not in output
    cores = subprocess.run(["pgrep", "-f", f"engine.process.loop .*--parent {proc.pid}"],
                           capture_output=True, text=True).stdout
    assert not cores.strip(), cores
