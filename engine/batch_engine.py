"""The engine in the HTTP process: an engine loop (engine/engine_loop.py) on a thread of its
own, fed from the event loop's threads.

HTTP handlers call `add_request` and `abort`; the engine thread steps the loop for as long
as there is work, and otherwise sleeps until something arrives (after an idle spell it
waits, briefly, for the rest of a burst its first request announces: engine/arrivals.py).
Outputs reach each request's callback on the engine thread: the loop's token ids, with
their text made and stop strings found on the way (engine/text_outputs.py, as the client of
an engine core process does), and finished requests counted there.

Admission: a request is refused (QueueFullError, HTTP 429) when --max-waiting requests or
--max-num-queued-tokens prompt tokens already wait for a seat, with a retry time from the
measured drain rate (engine/admission.py, over the loop's view of the line). After
`stop_accepting` (a graceful shutdown) or once the engine thread has died, every new request
is refused with EngineUnavailableError (HTTP 503). If the thread dies, each request in
flight ends with an error and the callbacks given to `on_failure` run, so the server can
exit and be restarted by its supervisor.

The engine core in a process of its own (the default) is driven by that process's busy
loop instead (engine/process/loop.py), and the API uses engine/process/client.py's client;
an engine is loaded from a model's name by engine/load.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext

from engine.admission import DrainRate
from engine.arrivals import gather
from engine.config import EngineConfig
from engine.core import EngineCore, EngineStats, PagedEngineCore
from engine.engine_loop import EngineLoop
from engine.front import EngineFront, ModelLimits
from engine.metrics import FrontMetrics
from engine.request import Request
from engine.snapshot import BLOCK_QUERY_TIMEOUT, CachedBlock
from model.llama import LlamaModel

log = logging.getLogger("nano_vllm.engine")


class BatchEngine(EngineFront):
    def __init__(self, config: EngineConfig, model: LlamaModel, tokenizer,
                 core_class: type[EngineCore] = PagedEngineCore) -> None:
        # The lock guards what other threads hand over (the loop's queues, its view of the
        # line) and the front's fields; re-entrant, as add_request holds it while the loop
        # takes it.
        super().__init__(config, tokenizer, threading.RLock(), self._end_sample)
        self.model = model
        self._wakeup = threading.Event()
        self.loop = EngineLoop(config, model, tokenizer, core_class, lock=self._lock,
                               wake=self._wakeup.set, totals=self._dashboard_totals)
        self.core = self.loop.core
        self.limits = ModelLimits(self.loop.max_tokens_per_request, self.loop.model_type,
                                  self.loop.max_position_embeddings, self.loop.embedding_info)
        self.metrics = FrontMetrics(self.loop.metrics.render, self.texts.finishes)
        self.snapshots = self.loop.snapshots
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batch-engine", daemon=True)
        self._block_queries: list[tuple[int, Future[CachedBlock | None]]] = []  # under _lock

    # --- called from other threads -------------------------------------------------------

    @property
    def drain_rate(self) -> DrainRate:
        return self.loop.drain_rate

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def unavailable_reason(self) -> str | None:
        """Why the engine takes no new requests (shutting down, dead), or None."""
        if self._unavailable is None and self._thread.ident is not None and not self.is_alive:
            return "The engine thread has stopped."
        return self._unavailable

    def abort_all(self, error: str) -> None:
        """End every request in flight with `error` (code SHUTDOWN) at the next step."""
        self.loop.abort_all(error)
        self._wakeup.set()

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _check_line(self, request: Request) -> None:
        """The loop's own view of the line: its core's counts now, and what was handed over
        since its last step."""
        stats = self.core.stats()
        self.loop.admission.check(self.config, request.num_prompt_tokens, stats["running"],
                                  stats["waiting"], self.loop.arrivals_tokens())

    def _hand_over(self, request: Request) -> None:
        """The loop's outputs go through the text outputs (which kept the request's own
        callback), on the engine thread."""
        request_id = request.request_id
        request.on_output = lambda output: self.texts.deliver([(request_id, output)])
        self.loop.add(request)

    def _handed_over(self) -> None:
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        """Cancel a request and all its samples (e.g. its client went away); their blocks are
        freed next step."""
        self.loop.abort(request_id)
        self._wakeup.set()

    def _end_sample(self, sample_id: str) -> None:
        """A stop string ended this sample in its text: the loop ends it too, freeing its
        blocks (engine thread)."""
        self.loop.end_sample(sample_id)

    def _dashboard_totals(self) -> dict[str, float]:
        return {**self.loop.metrics.dashboard_totals(), **self.metrics.dashboard_totals()}

    def cached_block(self, block_id: int,
                     timeout: float = BLOCK_QUERY_TIMEOUT) -> CachedBlock | None:
        """A cached-free block's content for the dashboard (None: not cached-free), read by
        the engine thread between steps; TimeoutError if it does not answer in time."""
        future: Future[CachedBlock | None] = Future()
        with self._lock:
            self._block_queries.append((block_id, future))
        self._wakeup.set()
        return future.result(timeout)

    def stats(self) -> EngineStats:
        with self._lock:
            return self.loop.stats()

    def describe(self) -> str:
        """One line for the startup message."""
        return self.loop.describe()

    def outputs_on(self, loop: asyncio.AbstractEventLoop) -> AbstractContextManager[None]:
        """Outputs stay on the engine thread, where they are made (api/engine_client.py)."""
        return nullcontext()

    # --- the engine thread -----------------------------------------------------------------

    def has_work(self) -> bool:
        return self.loop.has_work()

    def step(self) -> None:
        """One step of the loop (tests drive the engine this way, without its thread)."""
        self.loop.step()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # what the loop's own error handling could not catch
            log.critical("the engine thread died", exc_info=exc)
            self.die(f"The engine failed and takes no more requests: {exc!r}")

    def die(self, error: str) -> None:
        """End every request with `error`, refuse new ones, and tell whoever asked."""
        with self._lock:
            self._unavailable = error
        self.loop.die(error)
        self.texts.fail_all(error)  # any the loop's failure outputs did not reach
        self._failed()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._block_queries:
                self._answer_block_queries()
            if self.loop.has_work():
                self.loop.step()
            else:
                self.loop.snapshot_when_idle()
                self._wait_for_arrival(1.0)  # anything that arrived meanwhile is seen above
                gather(self.loop.arrivals_behind, self._wait_for_arrival,  # engine/arrivals.py
                       self.config.burst_wait_ms / 1000)

    def _wait_for_arrival(self, seconds: float) -> None:
        """Sleep until something is handed to the engine, or `seconds` pass."""
        self._wakeup.wait(timeout=seconds)
        self._wakeup.clear()

    def _answer_block_queries(self) -> None:
        with self._lock:
            queries, self._block_queries = self._block_queries, []
        for block_id, future in queries:
            future.set_result(self.loop.read_cached_block(block_id))
