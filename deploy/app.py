"""The Ray Serve application: N engine replicas behind one ingress.

`build_app` is what `python3 -m deploy.ray_serve` runs and what a Serve config file (or a
KubeRay RayService) can point at through `app_builder`. Only the replicas' router changes with
`router`: "prefix" (deploy/prefix_router.py) or "power-of-two" (Ray Serve's default, for
comparison).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deploy.ingress import Ingress
from deploy.prefix_router import PrefixAwareRouter
from deploy.replica import EngineReplica, Front
from engine.config import EngineConfig

ROUTERS = ("prefix", "power-of-two")
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 30.0
IN_PROCESS = ("each replica runs its engine on a thread of its own Ray actor process, which "
              "Ray places, counts and health-checks")
# server.py's flags for stopping its own process, which Ray Serve does for the replicas:
# refused, so that none is silently dropped.
SERVER_ONLY = {
    "--shutdown-timeout": "Ray Serve stops the replicas (graceful_shutdown_timeout_s)",
    "--exit-on-engine-failure": "Ray Serve's health checks replace a replica whose engine died",
    "--no-exit-on-engine-failure": "Ray Serve's health checks replace a replica whose engine "
                                   "died",
}


def given(flag: str, argv: Sequence[str]) -> bool:
    """Whether `argv` sets `flag` (as "--flag VALUE" or "--flag=VALUE")."""
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def replica_engine_config(args: argparse.Namespace, argv: Sequence[str]) -> EngineConfig:
    """server.py's engine flags (`args`, parsed from `argv`) for every replica, with the
    in-process defaults (--single-thread-below 16); ValueError for the flags of an engine
    core process, which replicas do not start, and for those that stop server.py's own
    process (SERVER_ONLY)."""
    refused = {**dict.fromkeys(("--engine-process", "--engine-cpus"), IN_PROCESS),
               **SERVER_ONLY}
    for flag, why in refused.items():
        if given(flag, argv):
            raise ValueError(f"{flag} is not supported by the Ray replicas: {why}")
    args.engine_process = False
    return EngineConfig.from_args(args)


def build_app(config: EngineConfig, model_name: str, replicas: int = 2,
              router: str = "prefix", router_kwargs: dict[str, Any] | None = None,
              front: Front | None = None) -> Application:
    """The application: `replicas` engine replicas behind one ingress, each replica's app
    checking what `front` says (keys, CORS, body size) as server.py's does."""
    front = front or Front()
    if replicas < 1:
        raise ValueError("--replicas must be at least 1")
    if router not in ROUTERS:
        raise ValueError(f"--router must be one of {', '.join(ROUTERS)}")
    options: dict[str, Any] = {}
    if router == "prefix":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAwareRouter,
            request_router_kwargs=router_kwargs or {})
    engines = serve.deployment(
        EngineReplica, name="EngineReplica", num_replicas=replicas,
        # Seats plus as many again waiting in the engine's line; beyond that requests wait in
        # Ray's router, which can still send them to whichever replica frees up.
        max_ongoing_requests=2 * config.max_num_seqs,
        ray_actor_options={"num_cpus": config.threads or 1},
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_timeout_s=5, **options,
    ).bind(config, model_name, front)
    ingress = serve.deployment(Ingress, name="Ingress", num_replicas=1,
                               max_ongoing_requests=10_000,
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(engines, front.max_request_bytes, front.access.allowed_origins)


def app_builder(args: dict[str, str]) -> Application:
    """For `serve run deploy.app:app_builder replicas=2 engine_args="--threads 1"` and for a
    Serve config file or a KubeRay RayService (`import_path: deploy.app:app_builder`, its
    `args` the same keys): `engine_args` are server.py's engine flags."""
    from server import build_parser, served_name

    unknown = set(args) - {"replicas", "router", "engine_args"}
    if unknown:
        raise ValueError(f"unknown application args: {', '.join(sorted(unknown))}")
    argv = shlex.split(args.get("engine_args", ""))
    for flag in ("--host", "--port"):
        if given(flag, argv):
            raise ValueError(f"{flag} is not an engine flag here: the Serve config's "
                             "http_options say where Ray Serve listens")
    parser = build_parser(None)
    parser.allow_abbrev = False  # "--shutdown-t 5" must not slip past its refusal
    engine_args = parser.parse_args(argv)
    return build_app(replica_engine_config(engine_args, argv), served_name(engine_args),
                     int(args.get("replicas", 2)), args.get("router", "prefix"),
                     front=Front.from_args(engine_args))
