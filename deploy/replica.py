"""One Ray Serve replica: one nano-vLLM engine, serving the single server's app in-process.

The ingress (deploy/ingress.py) forwards each HTTP request here through a deployment handle;
the replica runs it through api/app.py exactly as `server.py` would and streams the ASGI
messages back, tagged with the replica's id (`X-Nano-Vllm-Replica`) and process id
(`X-Nano-Vllm-Replica-Pid`) so a client or test can see where a request ran. Ray Serve calls
`check_health` every few seconds: a replica whose engine thread has stopped reports itself
unhealthy and is replaced, which also ends its in-flight requests with an error at the
ingress.

The engine runs on a thread of the replica's own process, not in an engine core process as
server.py's does: the replica already is a process of its own with no HTTP server in it (the
ingress parses HTTP), and Ray places it, counts its CPUs and health-checks it, which it
could not do for a child process it does not know of (deploy/app.py refuses the
engine-process flags).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from api.app import create_app
from api.limits import check_max_request_bytes
from api.security import AccessConfig
from deploy.asgi_call import ForwardedRequest, call_asgi
from engine.config import EngineConfig
from engine.heap import freeze_startup_heap
from engine.load import load_engine

REPLICA_HEADER = "x-nano-vllm-replica"
REPLICA_PID_HEADER = "x-nano-vllm-replica-pid"

log = logging.getLogger("nano_vllm.deploy")


@dataclass(frozen=True)
class Front:
    """What server.py's HTTP front checks, here checked by each replica's app (the ingress
    forwards every header) and, for the body size, by the ingress before it reads a body."""
    access: AccessConfig = field(default_factory=AccessConfig)
    max_request_bytes: int | None = None  # None: the replicas' default (api/limits.py)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Front:
        check_max_request_bytes(args.max_request_bytes)
        return cls(AccessConfig.from_args(args), args.max_request_bytes)


class EngineReplica:
    """The deployment's class (deploy/app.py wraps it in `serve.deployment`)."""

    def __init__(self, config: EngineConfig, model_name: str,
                 front: Front | None = None) -> None:
        front = front or Front()
        self.engine = load_engine(config)
        self.app = create_app(self.engine, model_name, front.access,
                              grammar_timeout=config.grammar_compile_timeout,
                              max_request_bytes=front.max_request_bytes,
                              accept_unknown_fields=config.accept_unknown_fields)
        self.engine.start()
        freeze_startup_heap()  # see engine/heap.py
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        log.info("replica %s (pid %d): %s", self.replica_id, os.getpid(),
                 self.engine.describe())

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[dict[str, Any]]:
        """The app's ASGI response messages for one request, the start tagged with us."""
        async for message in call_asgi(self.app, request):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    *message.get("headers", []),
                    (REPLICA_HEADER.encode(), self.replica_id.encode()),
                    (REPLICA_PID_HEADER.encode(), str(os.getpid()).encode())]}
            yield message

    def check_health(self) -> None:
        """Ray Serve replaces the replica when this raises."""
        if not self.engine.is_alive:
            raise RuntimeError(f"replica {self.replica_id}: the engine thread has stopped")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
