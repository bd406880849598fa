"""The engine thread: continuous batching around an engine core.

HTTP handlers (on the asyncio loop) call `add_request` and `abort`; the engine thread
loops for as long as there is work:

1. intake: take new requests, aborts and timed-out requests (releasing their blocks);
2. step the core: schedule, run the model once over every scheduled token (prefill
   chunks and decodes together), update each request from the output;
3. output processing: detokenize, check stop strings, count metrics, and hand each
   request its new text through its callback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import torch

from engine.config import EngineConfig
from engine.core import EngineCore, EngineStats, PagedEngineCore, StepResult
from engine.metrics import EngineMetrics
from engine.output_processor import OutputProcessor
from engine.request import FinishReason, Request
from model.llama import LlamaModel

log = logging.getLogger("nano_vllm.engine")


class QueueFullError(RuntimeError):
    """The waiting line is at --max-waiting."""


class BatchEngine:
    def __init__(self, config: EngineConfig, model: LlamaModel, tokenizer,
                 core_class: type[EngineCore] = PagedEngineCore) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        eos = set(model.cfg.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.core: EngineCore = core_class(config, model, eos)
        self.metrics = EngineMetrics()
        self.metrics.add_gauges(self.stats)
        self.outputs = OutputProcessor(tokenizer, self.metrics)

        self._lock = threading.Lock()  # guards _inbox and _aborts, filled by other threads
        self._inbox: deque[Request] = deque()
        self._aborts: set[str] = set()
        self._requests: dict[str, Request] = {}  # engine thread only
        self._groups: dict[str, list[Request]] = {}  # id -> its samples; engine thread only
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-engine", daemon=True)

    # --- called from other threads -------------------------------------------------------

    @property
    def max_tokens_per_request(self) -> int:
        return self.core.max_tokens_per_request

    @property
    def max_num_seqs(self) -> int:
        """Seats: also the most samples (n, best_of) one prompt can have."""
        return self.config.max_num_seqs

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def add_request(self, request: Request) -> None:
        if request.params.n > self.config.max_num_seqs:  # its samples could never all sit
            raise ValueError(f"n={request.params.n} samples need more than the "
                             f"{self.config.max_num_seqs} seats")
        with self._lock:
            if self._num_waiting_for_a_seat() >= self.config.max_waiting:
                raise QueueFullError(
                    f"the server is at capacity ({self.config.max_waiting} requests waiting)")
            self._inbox.append(request)
        self._wakeup.set()

    def _num_waiting_for_a_seat(self) -> int:
        """Requests in the intake line or the core's waiting line that no free seat awaits.

        The intake line is emptied only at the next step, so a burst that arrives between
        two steps sits there even while seats are free: counting all of it as waiting would
        refuse requests that are about to be seated. Each request counts as one seat (a
        request with n samples needs n, so this errs towards admitting)."""
        stats = self.core.stats()
        free_seats = max(0, self.config.max_num_seqs - stats["running"])
        return max(0, len(self._inbox) + stats["waiting"] - free_seats)

    def abort(self, request_id: str) -> None:
        """Cancel a request and all its samples (e.g. its client went away); their blocks are
        freed next step."""
        with self._lock:
            self._aborts.add(request_id)
        self._wakeup.set()

    def stats(self) -> EngineStats:
        stats = self.core.stats()
        stats["waiting"] += len(self._inbox)
        return stats

    def describe(self) -> str:
        """One line for the startup message."""
        return self.core.describe()

    # --- the engine thread -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._inbox or self._aborts or self.core.has_work():
                try:
                    self.step()
                except Exception as exc:  # outside the model run: fail everyone in flight
                    log.exception("engine step failed outside the model run")
                    for request in list(self._requests.values()):
                        self._finish(request, FinishReason.ERROR,
                                     f"internal error in the engine: {exc}")
            else:
                self._wakeup.wait(timeout=1.0)
                self._wakeup.clear()  # anything that arrived meanwhile is seen above

    def step(self) -> None:
        """One round: intake, one core step, output processing."""
        self._intake()
        result = self.core.step()
        self.metrics.on_step(result)
        if result.num_scheduled_tokens == 0:
            time.sleep(0.001)  # nothing fits yet (can only be momentary)
            return
        self._process(result)

    def _intake(self) -> None:
        with self._lock:
            arrivals, self._inbox = self._inbox, deque()
            aborts, self._aborts = self._aborts, set()
        for request in arrivals:
            # Samples 1.. wait on the first until its prompt is computed (see scheduler.py).
            request.pending_forks = [request.fork(i) for i in range(1, request.params.n)]
            self._groups[request.request_id] = [request, *request.pending_forks]
            for sample in self._groups[request.request_id]:
                self._requests[sample.request_id] = sample
                self.outputs.add(sample)
            self.core.add(request)
        for request_id in aborts:
            for sample in self._groups.get(request_id, []):
                if sample.request_id in self._requests:
                    self._finish(sample, FinishReason.ABORT)
        now = time.monotonic()
        for request in list(self._requests.values()):
            limit = self._time_limit(request)
            if (limit is not None and now - request.arrival_time > limit
                    and request.request_id in self._requests):  # not ended with its parent
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
                self._forget(update.request)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        """End a request from outside the core's own stop checks (abort, error, timeout)."""
        self.core.finish(request, reason)
        self._forget(request)
        self.outputs.finish(request, reason, error)
        for sample in request.pending_forks:  # never forked: they end with it
            self._finish(sample, reason, error)

    def _forget(self, request: Request) -> None:
        """Drop a finished request, and its group once every sample has finished."""
        self._requests.pop(request.request_id, None)
        group = self._groups.get(request.group_id, [])
        if all(sample.request_id not in self._requests for sample in group):
            self._groups.pop(request.group_id, None)


def load_engine(config: EngineConfig,
                core_class: type[EngineCore] = PagedEngineCore) -> BatchEngine:
    """Prepare or find the model, load it and its tokenizer, and build an engine around a
    core of `core_class` (baseline_server.py passes its own)."""
    from transformers import AutoTokenizer

    from model.loader import load_model, pick_device, pick_dtype
    from model.prepare import resolve_model_dir

    model_dir = resolve_model_dir(config.model)
    device = pick_device(config.device)
    log.info("loading %s on %s (%s, %s weights)", model_dir, device, config.dtype,
             config.weights)
    if config.weights == "q4_1":
        from model.quantized import load_q4_1_model
        model = load_q4_1_model(model_dir)
    elif config.weights == "int8":
        from model.int8 import load_int8_model
        model = load_int8_model(model_dir)
    else:
        model = load_model(model_dir, device, pick_dtype(config.dtype),
                           fused_ops=config.fused_ops, matmul=config.matmul)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.set_grad_enabled(False)
    return BatchEngine(config, model, tokenizer, core_class)
