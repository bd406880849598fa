"""Which of several models are loaded, and their lifetime: loaded on a request's demand,
unloaded when idle or to make room, reloaded after a failure.

Each model is in one state (seen in /health and /v1/models):

    unloaded --request or POST .../load--> loading --its engine is up--> loaded
    loaded --idle, LRU, or POST .../unload--> unloading --its process exited--> unloaded
    loading or loaded --its engine process dies or fails to start--> failed

- A request for a model not loaded starts its load and waits for it, up to --model-load-
  timeout seconds; every request for a loading model waits on the same load (one process
  start). Past the bound: 503 with Retry-After; the load goes on.
- Before a load, the least recently used idle models (no request in flight, none being
  answered) are unloaded until the model fits --max-loaded-models and --models-memory
  (api/model_budget.py). If none can be, the request waits (within its bound) for one to
  become idle, then gets 503.
- A failed model's requests in flight end with an error; its process is cleaned up, and the
  next request after RESTART_BACKOFF seconds (doubling with each failure in a row, up to
  MAX_RESTART_BACKOFF) loads it again; before that, 503 with Retry-After.

Everything here runs on the server's event loop, apart from the loads and process stops
(each on a thread of its own) and the lifecycle calls of api/lifecycle.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, suppress

from api.model_budget import LoadPolicy, gib, retry_seconds, room_for
from api.model_slot import (
    FAILED,
    LOADED,
    LOADING,
    MAX_RESTART_BACKOFF,
    RESTART_BACKOFF,
    UNLOADED,
    UNLOADING,
    ModelSlot,
    ServedModel,
    join_threads,
    on_thread,
    unavailable,
)

log = logging.getLogger("nano_vllm.api")

STOP_WAIT = 15.0  # seconds the server's exit waits for loads still going on
STATS_KEYS = ("blocks_used", "blocks_free", "blocks_cached_free", "blocks_total")


class ModelPool:
    """The models' slots, and, to api/lifecycle.py, one engine (drained, stopped together)."""

    def __init__(self, slots: list[ModelSlot], build: Callable[[str, str | None], ServedModel],
                 policy: LoadPolicy, budget: int | None) -> None:
        """`build(name, path)` loads a model (blocking: it is called on a thread of its own);
        `slots` as api/model_slot.py's start_slots leaves them."""
        self.slots = {slot.name: slot for slot in slots}
        self.default = slots[0].name
        self.build, self.policy, self.budget = build, policy, budget
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._closing: str | None = None  # why new requests are refused (the drain)
        self._closed = False  # the server is stopping: a load that ends now is stopped
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []  # loads and stops running now
        self._built: list[ServedModel] = []  # loaded on a loader thread, not yet stopped
        self._idle_task: asyncio.Task | None = None
        for slot in slots:
            if slot.model is not None:
                self._watch(slot, slot.model)

    # --- what requests use (on the loop) ---------------------------------------------------

    async def acquire(self, name: str) -> ServedModel:
        """The model, loaded (loading it first if need be), counted busy until `release`;
        APIError 503 with Retry-After if it is not loaded within the bound."""
        slot = self.slots[name]
        deadline = time.monotonic() + self.policy.load_timeout
        why_not = ""
        while True:
            if self._closing is not None:
                raise unavailable(self._closing, code="service_unavailable")
            if slot.state == LOADED and slot.model is not None and not slot.model.engine.is_alive:
                raise unavailable(f"The engine of '{name}' has just failed; it is loaded "
                                  "again on demand.", RESTART_BACKOFF)  # (its callback comes)
            if slot.state == LOADED and slot.model is not None:
                slot.active += 1
                slot.last_used = time.monotonic()
                return slot.model
            now = time.monotonic()
            if slot.state == FAILED and now < slot.retry_at:
                raise unavailable(f"{slot.error} It is loaded again by the first request in "
                                  f"{retry_seconds(slot.retry_at - now)} s.", slot.retry_at - now)
            if slot.state in (UNLOADED, FAILED):
                why_not = self._start_load(slot)
            left = deadline - time.monotonic()
            if left <= 0:
                raise unavailable(why_not or f"The model '{name}' is still {slot.state} after "
                                  f"{self.policy.load_timeout:g} s (--model-load-timeout); "
                                  "try again shortly.", max(1.0, self.policy.load_timeout / 4))
            await self._wait_change(left)

    def release(self, model: ServedModel) -> None:
        slot = self.slots[model.name]
        slot.active -= 1
        slot.last_used = time.monotonic()
        self._notify()  # a load waiting for room may find this one idle

    async def load(self, name: str) -> str:
        """An operator's load: the state once loaded (APIError as `acquire`)."""
        self.release(await self.acquire(name))
        return self.slots[name].state

    async def unload(self, name: str) -> str:
        """An operator's unload: the state afterwards; APIError 409 while the model is
        loading or has requests in flight (it is never unloaded under them)."""
        slot = self.slots[name]
        if slot.state == LOADED:
            if slot.in_flight:
                raise unavailable(f"The model '{name}' has {slot.in_flight} requests in "
                                  "flight; unload it once they have finished.",
                                  code="model_busy", status=409)
            self._begin_unload(slot, "unloaded by an operator")
        elif slot.state == LOADING:
            raise unavailable(f"The model '{name}' is loading; unload it once it is loaded.",
                              code="model_busy", status=409)
        if slot.task is not None and slot.state == UNLOADING:
            await asyncio.wait_for(asyncio.shield(slot.task), STOP_WAIT)
        return slot.state

    @property
    def closing(self) -> str | None:
        """Why new requests are refused (the server is draining); None while serving."""
        return self._closing

    def state(self, name: str) -> str:
        slot = self.slots[name]
        if slot.state == LOADED and slot.model is not None and not slot.model.engine.is_alive:
            return FAILED  # (its death is being dealt with)
        return slot.state

    def loaded(self) -> list[ServedModel]:
        return [s.model for s in self.slots.values() if s.state == LOADED and s.model]

    # --- loading and unloading (on the loop) ----------------------------------------------

    def _start_load(self, slot: ModelSlot) -> str:
        """Make room and start the load; "" once started, else why it cannot be yet."""
        victims = room_for(slot, list(self.slots.values()), self.policy, self.budget)
        if victims is None:
            limits = [f"--max-loaded-models {self.policy.max_loaded}"] if (
                self.policy.max_loaded) else []
            if self.budget is not None:
                limits.append(f"the memory budget {gib(self.budget)} (--models-memory)")
            return (f"The model '{slot.name}' cannot be loaded now: {' and '.join(limits)} "
                    "leave no room, and every loaded model has requests in flight; try "
                    "again shortly.")
        for victim in victims:
            log.info("unloading %s (least recently used) to load %s", victim.name, slot.name)
            self._begin_unload(victim, f"unloaded to make room for '{slot.name}'")
        waits = [s.task for s in self.slots.values()
                 if s.task is not None and s.state in (UNLOADING, FAILED)]
        slot.state, slot.error = LOADING, None
        slot.task = asyncio.get_running_loop().create_task(self._load(slot, waits))
        self._notify()
        return ""

    async def _load(self, slot: ModelSlot, waits: list[asyncio.Task]) -> None:
        await asyncio.gather(*waits, return_exceptions=True)  # their memory given back first
        started = time.monotonic()
        try:
            model = await on_thread(self._threads, self._build, slot)
        except Exception as exc:  # whatever stopped the load is the model's
            from model.memory import describe_start_error

            self._fail(slot, f"The model '{slot.name}' failed to load: "
                             f"{describe_start_error(exc)}")
            return
        slot.model = model
        self._watch(slot, model)
        slot.lifespan = AsyncExitStack()
        await slot.lifespan.enter_async_context(model.app.router.lifespan_context(model.app))
        slot.state, slot.last_used = LOADED, time.monotonic()
        if model.engine.is_alive:
            slot.failures = 0
        log.info("loaded %s in %.1f s", slot.name, time.monotonic() - started)
        self._notify()

    def _build(self, slot: ModelSlot) -> ServedModel:  # on a loader thread
        model = self.build(slot.name, slot.path)
        model.engine.start()
        with self._lock:
            closed = self._closed  # the server stopped meanwhile
            if not closed:
                self._built.append(model)
        if closed:
            model.engine.shutdown()
            raise RuntimeError("the server is stopping")
        return model

    def _begin_unload(self, slot: ModelSlot, reason: str) -> None:
        assert slot.model is not None
        slot.state = UNLOADING
        slot.model.engine.stop_accepting(f"The model '{slot.name}' was {reason}.")
        slot.task = asyncio.get_running_loop().create_task(self._stop(slot, slot.model,
                                                                      UNLOADED))
        self._notify()

    async def _stop(self, slot: ModelSlot, model: ServedModel, then: str) -> None:
        """Stop the model's app and engine process (its memory given back), then `then`."""
        stack, slot.lifespan = slot.lifespan, None
        if stack is not None:
            await stack.aclose()
        await on_thread(self._threads, model.engine.shutdown)
        with self._lock:
            self._built = [m for m in self._built if m is not model]
        if slot.model is model:
            slot.model = None
            if slot.state in (UNLOADING, FAILED):
                slot.state = then
        log.info("%s: its engine process has exited", slot.name)
        self._notify()

    def _fail(self, slot: ModelSlot, error: str) -> None:
        log.error("%s; its requests get 503, the other models serve on", error)
        slot.state, slot.error = FAILED, error
        slot.failures += 1
        backoff = min(MAX_RESTART_BACKOFF, RESTART_BACKOFF * 2 ** (slot.failures - 1))
        slot.retry_at = time.monotonic() + backoff
        self._notify()

    def _watch(self, slot: ModelSlot, model: ServedModel) -> None:
        def failed() -> None:  # on the engine's reader thread, or the loop's
            if self._loop is not None and not self._closed:
                self._loop.call_soon_threadsafe(self._engine_died, slot, model)

        model.engine.on_failure(failed)

    def _engine_died(self, slot: ModelSlot, model: ServedModel) -> None:
        if slot.model is not model or slot.state not in (LOADED, LOADING):
            return
        reason = model.engine.unavailable_reason or "its engine process exited"
        self._fail(slot, f"The engine of '{slot.name}' failed ({reason})")
        slot.task = asyncio.get_running_loop().create_task(self._stop(slot, model, FAILED))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, timeout: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _unload_idle(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(min(1.0, seconds / 4))
            now = time.monotonic()
            for slot in self.slots.values():
                if slot.idle and now - slot.last_used >= seconds:
                    log.info("unloading %s: unused for %g s", slot.name, seconds)
                    self._begin_unload(slot, f"unloaded after {seconds:g} s unused")

    # --- the server's lifespan (on the loop) ----------------------------------------------

    async def open(self) -> None:
        """Serve: the loaded apps' start-up, and the idle watch."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        for slot in self.slots.values():
            if slot.model is not None:
                slot.lifespan = AsyncExitStack()
                await slot.lifespan.enter_async_context(
                    slot.model.app.router.lifespan_context(slot.model.app))
        if self.policy.idle_unload is not None:
            self._idle_task = self._loop.create_task(self._unload_idle(self.policy.idle_unload))

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        for slot in self.slots.values():
            stack, slot.lifespan = slot.lifespan, None
            if stack is not None:
                await stack.aclose()

    # --- what api/lifecycle.py uses, as of one engine (on any thread) --------------------

    @property
    def num_in_flight(self) -> int:
        return sum(slot.in_flight for slot in self.slots.values())

    def start(self) -> None:
        for model in self.loaded():
            model.engine.start()

    def stop_accepting(self, reason: str) -> None:
        self._closing = reason
        for slot in list(self.slots.values()):
            if slot.model is not None:
                slot.model.engine.stop_accepting(reason)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._notify)  # waiting requests get the 503

    def abort_all(self, error: str) -> None:
        for slot in list(self.slots.values()):
            if slot.model is not None:
                slot.model.engine.abort_all(error)

    def on_failure(self, callback: Callable[[], None]) -> None:
        """The server does not exit for one model's failure."""

    def shutdown(self) -> None:
        """Stop every engine process, and every load still going on (a load that cannot be
        waited for leaves a process that exits once this one has: it watches its parent)."""
        with self._lock:
            self._closed = True
            built = list(self._built)
        for model in [*(s.model for s in self.slots.values() if s.model), *built]:
            model.engine.shutdown()  # (a second call returns at once)
        join_threads(self._threads, STOP_WAIT)

    def stats(self) -> dict[str, int]:
        totals = dict.fromkeys(STATS_KEYS, 0)
        for slot in self.slots.values():
            if slot.model is not None:
                for key, value in slot.model.engine.stats().items():
                    totals[key] = totals.get(key, 0) + value
        return totals
