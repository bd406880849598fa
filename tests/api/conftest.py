"""Servers for the API tests: the real app over real HTTP on loopback, one model for all.

`server` is a roomy engine; `small_server` has one seat and a waiting line of two, to
see backpressure. Both run uvicorn in a background thread on a port the OS picks.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import uvicorn

from api.app import create_app
from api.security import AccessConfig
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig

MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass
class RunningServer:
    engine: BatchEngine
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def serve(engine: BatchEngine, access: AccessConfig | None = None,
          max_request_bytes: int | None = None,
          model_name: str = MODEL_NAME) -> Iterator[RunningServer]:
    """Start the engine and uvicorn on a free port; stop both afterwards."""
    app = create_app(engine, model_name, access, max_request_bytes=max_request_bytes)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # bound here, handed to uvicorn: no race for the port
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"uvicorn-{port}", daemon=True)
    engine.start()
    thread.start()
    running = RunningServer(engine, port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{running.url}/health", timeout=2,
                             headers=probe_headers(access)).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {port} did not come up")
            time.sleep(0.05)
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()
        sock.close()


def probe_headers(access: AccessConfig | None) -> dict[str, str]:
    """What /health needs: a key, if the server asks one there."""
    if access and access.protect_health_metrics:
        return {"Authorization": f"Bearer {access.api_keys[0]}"}
    return {}


@pytest.fixture(scope="session")
def server(model, tokenizer) -> Iterator[RunningServer]:
    yield from serve(BatchEngine(EngineConfig(num_blocks=256), model, tokenizer))


@pytest.fixture(scope="session")
def small_server(model, tokenizer) -> Iterator[RunningServer]:
    """One seat, at most two waiting: the rest must be turned away with 429."""
    config = EngineConfig(num_blocks=64, max_num_seqs=1, max_waiting=2)
    yield from serve(BatchEngine(config, model, tokenizer))


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    """The official client, on `server`."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
