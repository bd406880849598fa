"""One model of several a server serves, loaded or not (api/model_pool.py decides which),
and a thread to load or stop one on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI

from api.engine_client import ServedEngine
from api.errors import APIError
from api.model_budget import LoadPolicy, estimate_bytes, gib, loaded_at_start, retry_seconds
from engine.config import EngineConfig

LOADED, LOADING, UNLOADING, UNLOADED, FAILED = (
    "loaded", "loading", "unloading", "unloaded", "failed")
RESTART_BACKOFF = 5.0  # seconds after a failure before a request loads the model again ...
MAX_RESTART_BACKOFF = 60.0  # ... doubling with each failure in a row, up to this


@dataclass
class ServedModel:
    name: str
    engine: ServedEngine
    app: FastAPI


@dataclass(eq=False)
class ModelSlot:
    """One model the server serves, loaded or not."""

    name: str
    path: str | None  # what --model names (None: the default model)
    estimate: int  # bytes, api/model_budget.py's
    model: ServedModel | None = None
    state: str = UNLOADED
    error: str | None = None  # why it failed
    active: int = 0  # requests being answered by its app now
    last_used: float = field(default_factory=time.monotonic)
    failures: int = 0  # in a row
    retry_at: float = 0.0  # a failed model is loaded again from then on
    task: asyncio.Task | None = None  # its load, unload or clean-up
    lifespan: AsyncExitStack | None = None  # its app's, while loaded

    @property
    def in_flight(self) -> int:
        return self.active + (self.model.engine.num_in_flight if self.model else 0)

    @property
    def idle(self) -> bool:
        return self.state == LOADED and self.in_flight == 0


def unavailable(message: str, retry_after: float | None = None, code: str = "model_unavailable",
                status: int = 503) -> APIError:
    return APIError(message, "model", status=status, code=code, err_type="server_error",
                    retry_after=None if retry_after is None else retry_seconds(retry_after))


async def on_thread(threads: list[threading.Thread], work: Callable[..., Any],
                    *args: Any) -> Any:
    """`work(*args)` on a daemon thread of its own (so that a load cannot hold the server's
    exit up; kept in `threads` while it runs), awaited on the running loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            result, error = work(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, error)

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error else future.set_result(result)

    thread = threading.Thread(target=run, name="model-loader", daemon=True)
    threads[:] = [t for t in threads if t.is_alive()] + [thread]
    thread.start()
    return await future


def join_threads(threads: list[threading.Thread], timeout: float) -> None:
    """Wait up to `timeout` seconds in all for the loads and stops still running."""
    deadline = time.monotonic() + timeout
    for thread in list(threads):
        thread.join(max(0.0, deadline - time.monotonic()))


def start_slots(entries: list[tuple[str, str | None]], config: EngineConfig, policy: LoadPolicy,
                build: Callable[[str, str | None], ServedModel],
                started: list[ServedModel]) -> tuple[list[ModelSlot], int | None]:
    """Estimate each model (name, path), load those the policy loads at start (appended to
    `started` as they come up) and leave the rest unloaded: the slots, and the memory budget.
    ValueError for a model whose estimate alone exceeds the budget."""
    from model.memory import available_bytes
    from model.prepare import resolve_model_dir

    free = available_bytes()
    budget = policy.memory if policy.memory is not None else free
    estimates = [estimate_bytes(replace(config, model=path), resolve_model_dir(path), free)
                 for _, path in entries]
    for (name, _), estimate in zip(entries, estimates, strict=True):
        if budget is not None and estimate > budget:
            raise ValueError(f"the model {name!r} is estimated at {gib(estimate)} (weights, "
                             f"KV cache, process), more than the models' memory budget "
                             f"{gib(budget)} (--models-memory)")
    count = loaded_at_start(estimates, policy, budget)
    print(f"models' memory budget {gib(budget)}; estimates: "
          + ", ".join(f"{n} {gib(e)}" for (n, _), e in zip(entries, estimates, strict=True))
          + f"; loaded at start: {', '.join(n for n, _ in entries[:count])}", flush=True)
    slots = []
    for k, ((name, path), estimate) in enumerate(zip(entries, estimates, strict=True)):
        slot = ModelSlot(name, path, estimate)
        if k < count:
            slot.model, slot.state = build(name, path), LOADED
            started.append(slot.model)
        slots.append(slot)
    return slots, budget
