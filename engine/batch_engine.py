"""The engine thread: continuous batching around an engine core.

HTTP handlers (on the asyncio loop) call `add_request` and `abort`; the engine thread
loops for as long as there is work:

1. intake: take new requests, aborts and timed-out requests (releasing their blocks);
2. step the core: schedule, run the model once over every scheduled token (prefill
   chunks and decodes together), update each request from the output;
3. output processing: count metrics and hand each request its new tokens through its
   callback; with their text and stop strings checked (engine/detokenizer.py's SampleText),
   unless the engine runs in a core process, whose client does that in the API process.

Admission: a request is refused (QueueFullError, HTTP 429) when --max-waiting requests or
--max-num-queued-tokens prompt tokens already wait for a seat, with a retry time from the
measured drain rate (engine/admission.py). After `stop_accepting` (a graceful shutdown) or
once the engine thread has died, every new request is refused with EngineUnavailableError
(HTTP 503). If the thread dies, each request in flight ends with an error and the callbacks
given to `on_failure` run, so the server can exit and be restarted by its supervisor.

Beside it: the samples of one prompt fan out in engine/in_flight.py, admission's view of the
line is engine/admission.py's LineTracker, and the dashboard's step records and snapshots are
engine/snapshot.py's StepRecorder; an engine is loaded from a model's name by engine/load.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext

from engine.admission import (
    DrainRate,
    EngineUnavailableError,
    LineSize,
    LineTracker,
    check_samples,
)
from engine.arrivals import gather
from engine.config import EngineConfig
from engine.core import EngineCore, EngineStats, PagedEngineCore, StepResult
from engine.in_flight import InFlight
from engine.metrics import EngineMetrics
from engine.output_processor import OutputProcessor
from engine.request import ENGINE_FAILED, SHUTDOWN, FinishReason, Request, RequestOutput
from engine.snapshot import BLOCK_QUERY_TIMEOUT, CachedBlock, StepRecorder
from model.llama import LlamaModel

log = logging.getLogger("nano_vllm.engine")


class BatchEngine:
    def __init__(self, config: EngineConfig, model: LlamaModel, tokenizer,
                 core_class: type[EngineCore] = PagedEngineCore, detokenize: bool = True) -> None:
        """`detokenize=False`: outputs carry token ids and no text; stop strings are found,
        and finished requests counted, elsewhere (engine/process/loop.py: its client, which
        calls `end_by_stop_string`)."""
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        eos = set(model.cfg.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.core: EngineCore = core_class(config, model, eos)
        self.metrics = EngineMetrics(count_finishes=detokenize)
        self.metrics.add_gauges(self.stats)
        self.outputs = OutputProcessor(tokenizer, self.metrics, detokenize)

        self._lock = threading.Lock()  # guards _inbox, _aborts, _stops: filled by other threads
        self._inbox: deque[Request] = deque()
        self._aborts: set[str] = set()
        self._stops: set[str] = set()  # samples whose text reached a stop string elsewhere
        self._in_flight = InFlight()  # each sample of every request taken in (engine thread)
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batch-engine", daemon=True)
        # Admission (read by other threads under _lock; written by the engine thread).
        self._admission = LineTracker()
        self._unavailable: str | None = None  # why new requests are refused, if they are
        self._abort_all: str | None = None  # an error to end every request with, next round
        self._failure_callbacks: list[Callable[[], None]] = []
        # The dashboard's view (engine/snapshot.py); only a paged core has a pool to show.
        self._recorder = StepRecorder.for_core(self.core, self._wakeup.set,
                                               self.metrics.dashboard_totals)
        self.snapshots = self._recorder.board if self._recorder is not None else None
        self._block_queries: list[tuple[int, Future[CachedBlock | None]]] = []  # under _lock

    # --- called from other threads -------------------------------------------------------

    @property
    def drain_rate(self) -> DrainRate:
        return self._admission.drain_rate

    @property
    def max_tokens_per_request(self) -> int:
        return self.core.max_tokens_per_request

    @property
    def model_type(self) -> str:
        return self.model.cfg.model_type

    @property
    def max_position_embeddings(self) -> int:
        return self.model.cfg.max_position_embeddings

    @property
    def max_num_seqs(self) -> int:
        """Seats: also the most samples (n, best_of) one prompt can have."""
        return self.config.max_num_seqs

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def scheduling_policy(self) -> str:
        return self.config.scheduling_policy

    @property
    def unavailable_reason(self) -> str | None:
        """Why the engine takes no new requests (shutting down, dead), or None."""
        if self._unavailable is None and self._thread.ident is not None and not self.is_alive:
            return "The engine thread has stopped."
        return self._unavailable

    @property
    def num_in_flight(self) -> int:
        """Requests (samples counted apiece) accepted and not yet finished."""
        with self._lock:
            return len(self._inbox) + len(self._in_flight)

    def stop_accepting(self, reason: str) -> None:
        """Refuse every new request from now on (EngineUnavailableError with `reason`)."""
        with self._lock:
            self._unavailable = self._unavailable or reason
        log.info("no longer accepting requests: %s", reason)

    def abort_all(self, error: str) -> None:
        """End every request in flight with `error` (code SHUTDOWN) at the next round."""
        with self._lock:
            self._abort_all = error
        self._wakeup.set()

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the engine thread) if the engine thread dies."""
        self._failure_callbacks.append(callback)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def add_request(self, request: Request) -> None:
        check_samples(self.config, request.params.n)
        with self._lock:
            if self._unavailable is not None:
                raise EngineUnavailableError(self._unavailable)
            self._admit(request)
            self._inbox.append(request)
        self._wakeup.set()

    def enqueue(self, request: Request) -> None:
        """Queue a request already admitted elsewhere (engine/process/loop.py: the API
        process's client does admission): no check of the line or of the engine's state."""
        with self._lock:
            self._inbox.append(request)
        self._wakeup.set()

    def _admit(self, request: Request) -> None:
        """Raise QueueFullError if the line is full (engine/admission.py). Call with _lock
        held. The intake line is emptied only at the next step."""
        stats = self.core.stats()
        self._admission.check(self.config, request.num_prompt_tokens, stats["running"],
                              stats["waiting"], [r.num_prompt_tokens for r in self._inbox])

    def abort(self, request_id: str) -> None:
        """Cancel a request and all its samples (e.g. its client went away); their blocks are
        freed next step."""
        with self._lock:
            self._aborts.add(request_id)
        self._wakeup.set()

    def end_by_stop_string(self, sample_id: str) -> None:
        """End one sample (its own id) with finish reason stop, its blocks freed next step:
        its text, made elsewhere, reached a stop string. Nothing if it has ended already."""
        with self._lock:
            self._stops.add(sample_id)
        self._wakeup.set()

    def cached_block(self, block_id: int,
                     timeout: float = BLOCK_QUERY_TIMEOUT) -> CachedBlock | None:
        """A cached-free block's content for the dashboard (None: not cached-free), read by
        the engine thread between steps; TimeoutError if it does not answer in time."""
        future: Future[CachedBlock | None] = Future()
        with self._lock:
            self._block_queries.append((block_id, future))
        self._wakeup.set()
        return future.result(timeout)

    def read_cached_block(self, block_id: int) -> CachedBlock | None:
        """cached_block's answer, on the engine thread (a core without a pool has none)."""
        if self._recorder is None:
            return None
        return self._recorder.read_cached_block(block_id)

    def snapshot_when_idle(self) -> None:
        """With nothing to step: the last step's end for a watcher (engine thread)."""
        if self._recorder is not None:
            self._recorder.idle()

    def stats(self) -> EngineStats:
        stats = self.core.stats()
        stats["waiting"] += len(self._inbox)
        return stats

    def describe(self) -> str:
        """One line for the startup message."""
        return self.core.describe()

    def outputs_on(self, loop: asyncio.AbstractEventLoop) -> AbstractContextManager[None]:
        """Outputs stay on the engine thread, where they are made (api/engine_client.py)."""
        return nullcontext()

    # --- the engine thread -----------------------------------------------------------------

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
            arrivals, self._inbox = self._inbox, deque()
        in_flight = self._in_flight.all()
        self._in_flight.clear()
        for request in in_flight:
            try:
                self.outputs.finish(request, FinishReason.ERROR, error, code=ENGINE_FAILED)
            except Exception:  # the processor may be what broke: answer directly
                self._send_failure(request, error)
        for request in arrivals:  # never taken in: the processor does not know them
            self._send_failure(request, error)
        for callback in self._failure_callbacks:
            callback()

    @staticmethod
    def _send_failure(request: Request, error: str) -> None:
        request.on_output(RequestOutput(request.request_id, "", [], finished=True,
                                        finish_reason=FinishReason.ERROR, error=error,
                                        error_code=ENGINE_FAILED,
                                        sample_index=request.sample_index))

    def has_work(self) -> bool:
        """Anything for a step to do: arrivals, aborts, or requests in the core."""
        return bool(self._inbox or self._aborts or self._stops or self._abort_all
                    or self.core.has_work())

    def guarded_step(self) -> None:
        """One step; an error outside the model run fails every request in flight (a
        BaseException passes through: the caller then calls `die`)."""
        try:
            self.step()
        except Exception as exc:
            log.exception("engine step failed outside the model run")
            for request in self._in_flight.all():
                self._finish(request, FinishReason.ERROR, f"internal error in the engine: {exc}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._block_queries:
                self._answer_block_queries()
            if self.has_work():
                self.guarded_step()
            else:
                self.snapshot_when_idle()
                self._wait_for_arrival(1.0)  # anything that arrived meanwhile is seen above
                gather(self._arrivals_behind, self._wait_for_arrival,  # engine/arrivals.py
                       self.config.burst_wait_ms / 1000)

    def _arrivals_behind(self) -> int:
        """What the latest arrival says is still coming (0 with none waiting)."""
        with self._lock:
            return self._inbox[-1].arrivals_behind if self._inbox else 0

    def _wait_for_arrival(self, seconds: float) -> None:
        """Sleep until something is handed to the engine, or `seconds` pass."""
        self._wakeup.wait(timeout=seconds)
        self._wakeup.clear()

    def _answer_block_queries(self) -> None:
        with self._lock:
            queries, self._block_queries = self._block_queries, []
        for block_id, future in queries:
            future.set_result(self.read_cached_block(block_id))

    def step(self) -> None:
        """One round: intake, one core step, output processing, a record for the dashboard."""
        start = time.perf_counter()
        self._intake()
        result = self.core.step()
        self.metrics.on_step(result)
        line = LineSize(self.core.stats()["waiting"], self.core.num_waiting_tokens())
        with self._lock:
            joined = self._admission.step_ended(line)
        self.drain_rate.observe(time.monotonic(), line, joined)
        if result.num_scheduled_tokens == 0:
            if self._recorder is not None:
                self._recorder.nothing_ran()
            time.sleep(0.001)  # nothing fits yet (can only be momentary)
            return
        self._process(result)
        self._record(result, start)

    def _record(self, result: StepResult, start: float) -> None:
        if self._recorder is None:
            return
        duration_ms = (time.perf_counter() - start) * 1000
        stats = self.core.stats()
        self._recorder.step_ran(result.num_prompt_tokens,
                                result.num_scheduled_tokens - result.num_prompt_tokens,
                                duration_ms, stats["running"], stats["waiting"],
                                result.num_preempted)

    def _intake(self) -> None:
        with self._lock:
            arrivals, self._inbox = self._inbox, deque()
            aborts, self._aborts = self._aborts, set()
            stops, self._stops = self._stops, set()
            abort_all, self._abort_all = self._abort_all, None
            self._admission.joined([r.num_prompt_tokens for r in arrivals])
        for request in arrivals:
            for sample in self._in_flight.take(request):  # n samples (engine/in_flight.py)
                self.outputs.add(sample)
            self.core.add(request)
        for request_id in aborts:
            for sample in self._in_flight.group(request_id):
                if sample.request_id in self._in_flight:
                    self._finish(sample, FinishReason.ABORT)
        for sample_id in stops:
            sample = self._in_flight.get(sample_id)
            if sample is not None:
                self._finish(sample, FinishReason.STOP)
        if abort_all is not None:
            for request in self._in_flight.all():
                if request.request_id in self._in_flight:  # not ended with its parent
                    self._finish(request, FinishReason.ERROR, abort_all, SHUTDOWN)
        now = time.monotonic()
        for request in self._in_flight.all():
            limit = self._time_limit(request)
            if (limit is not None and now - request.arrival_time > limit
                    and request.request_id in self._in_flight):  # not ended with its parent
                self._finish(request, FinishReason.TIMEOUT, f"request timed out after {limit:g} s")

    def _time_limit(self, request: Request) -> float | None:
        """The shorter of --request-timeout and the request's own deadline (None: none)."""
        limits = [t for t in (self.config.request_timeout, request.timeout) if t is not None]
        return min(limits, default=None)

    def _process(self, result: StepResult) -> None:
        for request in result.failed:
            self._finish(request, FinishReason.ERROR, result.error)
        now = time.monotonic()
        for update in result.updates:
            stopped = self.outputs.process(update, now)
            if stopped is not None:  # a stop string: the core has not unseated it yet
                self.core.finish(update.request, stopped)
            if update.request.finish_reason is not None:
                self._in_flight.forget(update.request)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None,
                code: str | None = None) -> None:
        """End a request from outside the core's own stop checks (abort, error, timeout, a
        stop string found elsewhere)."""
        self.core.finish(request, reason)
        self._in_flight.forget(request)
        self.outputs.finish(request, reason, error, code=code)
        for sample in request.pending_forks:  # never forked: they end with it
            self._finish(sample, reason, error, code)

