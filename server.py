"""nano-vLLM's OpenAI-compatible server: `python3 server.py` serves on 127.0.0.1:8080."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import uvicorn
from fastapi import FastAPI

from api import answer, lifecycle, limits
from api.answer import ChatFormat
from api.app import create_app
from api.engine_client import ServedEngine
from api.model_budget import LoadPolicy
from api.model_pool import ModelPool
from api.model_router import ModelRouter
from api.model_slot import ServedModel, start_slots
from api.security import AccessConfig
from engine.config import EngineConfig
from engine.heap import freeze_startup_heap
from engine.load import load_engine
from engine.process.client import EngineProcessClient, EngineStartError
from engine.process.loop import PAGED_CORE, core_class_at
from model.memory import describe_start_error
from model.prepare import MODEL_NAME, ModelPreparationError
from model.weights.quantized import QuantizedKernelUnavailable


def build_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--served-model-name", default=None,
                        help="name clients use in 'model' (default: the model folder's name)")
    EngineConfig.add_cli_args(parser)
    parser.add_argument("--engine-process", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="run the engine core in a process of its own, so that it does "
                             "not share the GIL with the HTTP server (the default); "
                             "--no-engine-process runs it on a thread of the server's "
                             "process, for debugging")
    parser.add_argument("--engine-cpus", default=None,
                        help="CPU ids to pin the engine core process to, e.g. 0,1 "
                             "(default: every CPU the server may use)")
    AccessConfig.add_cli_args(parser)
    limits.add_cli_args(parser)
    answer.add_cli_args(parser)
    lifecycle.add_cli_args(parser)
    LoadPolicy.add_cli_args(parser)
    return parser


# After a drain or an engine failure, the longest uvicorn waits for responses still being sent.
RESPONSE_GRACE_SECONDS = 10


def model_app(engine: ServedEngine, args: argparse.Namespace, model_name: str,
              access: AccessConfig, chat_format: ChatFormat | None = None) -> FastAPI:
    return create_app(engine, model_name, access, engine.config.grammar_compile_timeout,
                      args.max_request_bytes, engine.config.accept_unknown_fields, chat_format)


def serve(engine: ServedEngine, args: argparse.Namespace, model_name: str,
          access: AccessConfig, chat_format: ChatFormat | None = None) -> int:
    """Serve until SIGTERM/SIGINT (drained, then 0) or an engine failure; the exit status."""
    app = model_app(engine, args, model_name, access, chat_format)
    return run_until_stopped(app, engine, args, args.exit_on_engine_failure)


def serve_several(pool: ModelPool, args: argparse.Namespace, access: AccessConfig) -> int:
    """Serve several models behind one address (api/model_router.py), loaded and unloaded as
    api/model_pool.py says, until SIGTERM/SIGINT; one model's engine failing fails its
    requests only."""
    router = ModelRouter(pool, pool.loaded()[0].app.state.max_request_bytes, access)
    return run_until_stopped(router, pool, args, exit_on_engine_failure=False)


def run_until_stopped(app: Any, engine: Any, args: argparse.Namespace,
                      exit_on_engine_failure: bool) -> int:
    """uvicorn over `app` with the drain and failure handling of api/lifecycle.py."""
    server = lifecycle.ServingProcess(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                       timeout_graceful_shutdown=RESPONSE_GRACE_SECONDS),
        engine, args.shutdown_timeout, exit_on_engine_failure)
    engine.start()
    freeze_startup_heap()  # what start-up made is never garbage: no collection walks it
    try:
        server.run()
    finally:
        engine.shutdown()
    stats = engine.stats()
    print(f"stopped: {engine.num_in_flight} requests in flight; KV blocks used "
          f"{stats['blocks_used']}, free {stats['blocks_free']}, cached-free "
          f"{stats['blocks_cached_free']} of {stats['blocks_total']}", flush=True)
    return server.exit_code


def served_name(args: argparse.Namespace) -> str:
    """The first (or only) model's name, as clients send it."""
    return model_entries(args)[0][0]


def model_entries(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(name clients use, what --model names) for each --model: NAME=PATH sets the name,
    else --served-model-name (one model only) or the folder's or file's name. ValueError
    for two models of one name."""
    entries: list[tuple[str, str | None]] = []
    for given in args.model or [None]:
        name, path = None, given
        if given and "=" in given and "/" not in given.split("=", 1)[0]:
            name, path = given.split("=", 1)
        if name is None and args.served_model_name and len(args.model or []) <= 1:
            name = args.served_model_name
        if name is None:
            name = path.rstrip("/").split("/")[-1] if path else MODEL_NAME
        if path == MODEL_NAME:
            path = None  # the default model, prepared on first use
        if any(name == seen for seen, _ in entries):
            raise ValueError(f"two models are named {name!r}; name them with NAME=PATH")
        entries.append((name, path))
    return entries


def given_flags(description: str | None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The flags the command line gives (by dest, as parsed), defaults left out."""
    parser = build_parser(description)
    for action in parser._actions:  # (set_defaults would put the marker in the namespace)
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


def run_server(description: str | None, title: str = "nano-vLLM", core: str = PAGED_CORE,
               fixed: dict[str, object] | None = None,
               args: argparse.Namespace | None = None) -> int:
    """Parse the CLI (unless `args` come parsed), load the model into an engine around the
    core class at `core` ("module:Class"), serve until stopped. `fixed` sets config fields
    whatever the flags say (the baseline keeps PyTorch's model math)."""
    if args is None:
        args = build_parser(description).parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stopped_by: dict[str, int] = {}
    started: list[ServedModel] = []
    try:
        entries = model_entries(args)
        config = replace(EngineConfig.from_args(argparse.Namespace(
            **{**vars(args), "model": entries[0][1]})), **(fixed or {}))
        access = AccessConfig.from_args(args)
        limits.check_max_request_bytes(args.max_request_bytes)
        answer.check_budget(args.thinking_token_budget)
        policy = LoadPolicy.from_args(args)
        if len(entries) > 1 or policy.limits_lifetime:
            def build(name: str, path: str | None) -> ServedModel:
                engine = build_engine(replace(config, model=path), args, core)
                chat_format = answer.chat_format_from_args(args, engine.tokenizer)
                print(f"{title}: {name} on {engine.describe()}; "
                      f"{conventions(engine, chat_format)}", flush=True)
                return ServedModel(name, engine, model_app(engine, args, name, access,
                                                           chat_format))

            with stop_signals_interrupt(stopped_by):
                slots, budget = start_slots(entries, config, policy, build, started)
            pool = ModelPool(slots, build, policy, budget)
        else:
            with stop_signals_interrupt(stopped_by):
                engine = build_engine(config, args, core)
            chat_format = answer.chat_format_from_args(args, engine.tokenizer)
    except (ModelPreparationError, ValueError, QuantizedKernelUnavailable,
            EngineStartError, MemoryError) as exc:
        shut_down(started)
        print(f"error: {describe_start_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # SIGINT or SIGTERM before the server was up
        shut_down(started)
        signum = stopped_by.get("signal", signal.SIGINT)
        print(f"stopped while starting ({signal.Signals(signum).name})", file=sys.stderr)
        return 0 if signum == signal.SIGTERM else 128 + signum
    if started:
        print(f"{title}: {len(entries)} models ({', '.join(n for n, _ in entries)}); "
              f"serving on http://{args.host}:{args.port}/v1", flush=True)
        return serve_several(pool, args, access)
    print(f"{title}: {served_name(args)} on {engine.describe()}; "
          f"{conventions(engine, chat_format)}; "
          f"serving on http://{args.host}:{args.port}/v1", flush=True)
    return serve(engine, args, served_name(args), access, chat_format)


def shut_down(models: list[ServedModel]) -> None:
    for model in models:
        model.engine.shutdown()


@contextmanager
def stop_signals_interrupt(came: dict[str, int]) -> Iterator[None]:
    """While the model loads (up to a minute on a first start), SIGTERM stops start-up as
    Ctrl-C does: a KeyboardInterrupt that unwinds what was started (the engine core process
    included); `came["signal"]` says which signal it was. Serving sets its own handlers."""

    def interrupt(signum: int, _frame: object) -> None:
        came["signal"] = signum
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def conventions(engine: ServedEngine, chat_format: ChatFormat) -> str:
    """The start-up line's word on what the model answers: its thinking and call syntax, or,
    for an embedding model, where its vectors are served."""
    if engine.embedding_info is not None:
        return "embeddings at /v1/embeddings, /v1/rerank and /v1/score"
    return chat_format.describe()


def build_engine(config: EngineConfig, args: argparse.Namespace, core: str) -> ServedEngine:
    """The client of an engine core process, or (--no-engine-process) the engine on a thread
    of this process; ValueError for a combination that cannot run."""
    if args.engine_process:
        return EngineProcessClient(config, args.engine_cpus, core=core)
    if args.engine_cpus is not None:
        raise ValueError("--engine-cpus pins the engine core process, which "
                         "--no-engine-process does without")
    return load_engine(config, core_class_at(core))


def main() -> int:
    return run_server(__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
