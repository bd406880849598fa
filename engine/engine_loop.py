"""One driver of an engine core, for the thread that steps it: continuous batching itself.

Each `step`:

1. intake: take the requests handed over since the last step (fanning each out into its n
   samples, engine/in_flight.py), the aborts, the samples a stop string ended elsewhere, an
   order to end everything, and end the requests past their deadline (their blocks freed);
2. step the core: schedule, run the model once over every scheduled token (prefill chunks
   and decodes together), update each request from the output;
3. output processing: count metrics and hand each request its new tokens, as token ids,
   through its callback (engine/output_processor.py); the front that receives them makes
   the text and finds stop strings (engine/text_outputs.py), and calls `end_sample`.

Who drives it: the engine core process's busy loop (engine/process/loop.py), on its main
thread with no lock; in-process, engine/batch_engine.py's thread, which hands requests over
from the HTTP handlers' threads under the lock it passes here (`lock`: whatever the other
threads hold while they call add, abort, end_sample and abort_all).

Admission's view of the line (engine/admission.py's LineTracker) is kept here, where the
line changes; the thread front checks a new request against it under the same lock.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from engine.admission import DrainRate, LineSize, LineTracker
from engine.config import EngineConfig
from engine.core import EngineCore, EngineStats, PagedEngineCore, StepResult
from engine.embedding_core import EmbeddingEngineCore
from engine.in_flight import InFlight
from engine.metrics import EngineMetrics
from engine.output_processor import OutputProcessor
from engine.request import ENGINE_FAILED, SHUTDOWN, FinishReason, Request, RequestOutput
from engine.snapshot import CachedBlock, StepRecorder
from model.embedding import EmbeddingInfo, EmbeddingModel
from model.llama import LlamaModel

log = logging.getLogger("nano_vllm.engine")


class EngineLoop:
    def __init__(self, config: EngineConfig, model: LlamaModel, tokenizer,
                 core_class: type[EngineCore] = PagedEngineCore,
                 lock: AbstractContextManager | None = None,
                 wake: Callable[[], None] = lambda: None,
                 totals: Callable[[], dict[str, float]] | None = None) -> None:
        """`wake`: called when the dashboard wants a snapshot while the loop may be idle;
        `totals`: the dashboard's counters (default: this loop's metrics')."""
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        eos = set(model.cfg.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        if isinstance(model, EmbeddingModel):  # it generates nothing: a core of its own
            core_class = EmbeddingEngineCore
        self.core: EngineCore = core_class(config, model, eos)
        self.metrics = EngineMetrics()
        self.metrics.add_gauges(self.stats)
        self.outputs = OutputProcessor(self.metrics)
        self.admission = LineTracker()
        self._lock = lock if lock is not None else nullcontext()
        self._arrivals: deque[Request] = deque()  # handed over, not yet taken in
        self._aborts: set[str] = set()
        self._stops: set[str] = set()  # samples whose text reached a stop string elsewhere
        self._abort_all: str | None = None  # an error to end every request with, next step
        self._in_flight = InFlight()  # each sample of every request taken in
        # The dashboard's view (engine/snapshot.py); only a paged core has a pool to show.
        self._recorder = StepRecorder.for_core(self.core, wake,
                                               totals or self.metrics.dashboard_totals)
        self.snapshots = self._recorder.board if self._recorder is not None else None

    # --- handing work over (under `lock` where other threads call) -------------------------

    def add(self, request: Request) -> None:
        """Queue an admitted request: taken in at the next step."""
        with self._lock:
            self._arrivals.append(request)

    def abort(self, request_id: str) -> None:
        """Cancel a request and all its samples; their blocks are freed next step."""
        with self._lock:
            self._aborts.add(request_id)

    def end_sample(self, sample_id: str) -> None:
        """End one sample (its own id) with finish reason stop, its blocks freed next step:
        its text, made elsewhere, reached a stop string. Nothing if it has ended already."""
        with self._lock:
            self._stops.add(sample_id)

    def abort_all(self, error: str) -> None:
        """End every request in flight with `error` (code SHUTDOWN) at the next step."""
        with self._lock:
            self._abort_all = error

    def arrivals_tokens(self) -> list[int]:
        """The prompt tokens of each request handed over and not yet taken in (call under
        `lock`)."""
        return [r.num_prompt_tokens for r in self._arrivals]

    def arrivals_behind(self) -> int:
        """What the latest arrival says is still coming (0 with none waiting)."""
        with self._lock:
            return self._arrivals[-1].arrivals_behind if self._arrivals else 0

    # --- what the loop's state says ----------------------------------------------------------

    @property
    def drain_rate(self) -> DrainRate:
        return self.admission.drain_rate

    @property
    def max_tokens_per_request(self) -> int:
        return self.core.max_tokens_per_request

    @property
    def model_type(self) -> str:
        """The architecture served: config.json's model_type."""
        return self.model.cfg.model_type

    @property
    def max_position_embeddings(self) -> int:
        return self.model.cfg.max_position_embeddings

    @property
    def embedding_info(self) -> EmbeddingInfo | None:
        return self.model.info if isinstance(self.model, EmbeddingModel) else None

    @property
    def num_in_flight(self) -> int:
        """Requests (samples counted apiece) handed over and not yet finished."""
        return len(self._arrivals) + len(self._in_flight)

    def has_work(self) -> bool:
        """Anything for a step to do: arrivals, aborts, or requests in the core."""
        return bool(self._arrivals or self._aborts or self._stops or self._abort_all
                    or self.core.has_work())

    def stats(self) -> EngineStats:
        stats = self.core.stats()
        stats["waiting"] += len(self._arrivals)
        return stats

    def describe(self) -> str:
        """One line for the startup message."""
        return self.core.describe()

    def read_cached_block(self, block_id: int) -> CachedBlock | None:
        """A cached-free block's content for the dashboard (None: not cached-free, or a core
        without a pool); between steps."""
        if self._recorder is None:
            return None
        return self._recorder.read_cached_block(block_id)

    def snapshot_when_idle(self) -> None:
        """With nothing to step: the last step's end for a watcher."""
        if self._recorder is not None:
            self._recorder.idle()

    # --- stepping ------------------------------------------------------------------------------

    def step(self) -> None:
        """One step; an error outside the model run fails every request in flight (a
        BaseException passes through: the caller then calls `die`)."""
        try:
            self._step()
        except Exception as exc:
            log.exception("engine step failed outside the model run")
            for request in self._in_flight.all():
                self._finish(request, FinishReason.ERROR, f"internal error in the engine: {exc}")

    def _step(self) -> None:
        start = time.perf_counter()
        self._intake()
        result = self.core.step()
        self.metrics.on_step(result)
        line = LineSize(self.core.stats()["waiting"], self.core.num_waiting_tokens())
        with self._lock:
            joined = self.admission.step_ended(line)
        self.drain_rate.observe(time.monotonic(), line, joined)
        if result.num_scheduled_tokens == 0:
            if self._recorder is not None:
                self._recorder.nothing_ran()
            time.sleep(0.001)  # nothing fits yet (can only be momentary)
            return
        self._process(result)
        self._record(result, start)

    def die(self, error: str) -> None:
        """End every request, taken in or not, with `error` (ENGINE_FAILED)."""
        with self._lock:
            arrivals, self._arrivals = self._arrivals, deque()
        in_flight = self._in_flight.all()
        self._in_flight.clear()
        for request in in_flight:
            try:
                self.outputs.finish(request, FinishReason.ERROR, error, code=ENGINE_FAILED)
            except Exception:  # the processor may be what broke: answer directly
                send_failure(request, error)
        for request in arrivals:  # never taken in: the processor does not know them
            send_failure(request, error)

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
            arrivals, self._arrivals = self._arrivals, deque()
            aborts, self._aborts = self._aborts, set()
            stops, self._stops = self._stops, set()
            abort_all, self._abort_all = self._abort_all, None
            self.admission.joined([r.num_prompt_tokens for r in arrivals])
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
        self._end_overdue()

    def _end_overdue(self) -> None:
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
            self.outputs.process(update, now)
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


def send_failure(request: Request, error: str) -> None:
    """A request's last output, an engine failure, sent without the output processor."""
    request.on_output(RequestOutput(request.request_id, "", [], finished=True,
                                    finish_reason=FinishReason.ERROR, error=error,
                                    error_code=ENGINE_FAILED, sample_index=request.sample_index))
