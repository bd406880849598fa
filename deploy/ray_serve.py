"""Serve nano-vLLM from N replicas on a Ray cluster, behind a prefix-aware router.

    python3 -m deploy.ray_serve --replicas 2 --threads 1     # a local Ray cluster

serves the same OpenAI-compatible API as `server.py` on http://127.0.0.1:8080/v1. Engine
flags (--threads, --num-blocks, --model, ...) are server.py's and apply to every replica.
`--address auto` joins a running cluster instead of starting one (`ray start --head`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from server import build_parser, served_name

if TYPE_CHECKING:
    from deploy.replica import Front

APP_NAME = "nano-vllm"
REPO_ROOT = Path(__file__).resolve().parent.parent


def parser() -> argparse.ArgumentParser:
    p = build_parser(__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.allow_abbrev = False  # "--shutdown-t 5" must not slip past its refusal
    p.add_argument("--replicas", type=int, default=2, help="engine replicas (one engine each)")
    p.add_argument("--router", default="prefix", choices=["prefix", "power-of-two"],
                   help="prefix: requests go where their prompt's prefix is cached; "
                        "power-of-two: Ray Serve's default (the less loaded of two at random)")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join ('auto': the one `ray start` runs here); "
                        "default: start a local one")
    return p


def start(config: EngineConfig, model_name: str, replicas: int = 2, router: str = "prefix",
          host: str = "127.0.0.1", port: int = 8080, address: str | None = None,
          front: Front | None = None) -> None:
    """Start (or join) Ray and Serve, and deploy the application; returns once it is up."""
    import ray
    from ray import serve

    from deploy.app import build_app

    # Replicas import this repository's packages; a real cluster ships them in its image.
    runtime_env = {"env_vars": {"PYTHONPATH": str(REPO_ROOT)}}
    if address is None:  # local: enough logical CPUs for every replica's threads
        needed = replicas * (config.threads or 1)
        ray.init(num_cpus=max(os.cpu_count() or 1, needed), include_dashboard=False,
                 runtime_env=runtime_env, log_to_driver=False)
    else:
        ray.init(address=address, runtime_env=runtime_env)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(config, model_name, replicas, router, front=front), name=APP_NAME,
              route_prefix="/")


def main() -> int:
    args = parser().parse_args()
    try:
        from deploy.app import replica_engine_config
        from deploy.replica import Front
        config = replica_engine_config(args, sys.argv[1:])
        front = Front.from_args(args)
        if args.replicas < 1:
            raise ValueError("--replicas must be at least 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    start(config, served_name(args), args.replicas, args.router, args.host, args.port,
          args.address, front)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
        signal.signal(signum, lambda *_: stop.set())
    print(f"nano-vLLM on Ray Serve: {args.replicas} replicas, {args.router} routing; "
          f"serving on http://{args.host}:{args.port}/v1", flush=True)
    try:
        stop.wait()
    finally:
        import ray
        from ray import serve
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
