"""The engine thread: continuous batching over the paged KV cache.

HTTP handlers (on the asyncio loop) call `add_request` and `abort`; the engine
thread runs steps for as long as there is work:

1. drop aborted and timed-out requests, releasing their blocks;
2. schedule: seated requests first, then newcomers while seats, the token budget
   and KV blocks allow (reusing cached prefix blocks), preempting if the pool runs dry;
3. run the model once over every scheduled token: prefill chunks and decodes together;
4. sample a token for each sequence that reached its end, detokenize, check stop
   conditions, hand the output to the request's callback, and unseat finished ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import torch

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.metrics import EngineMetrics
from engine.model_runner import ModelRunner, SequenceStep
from engine.request import Request, RequestOutput, Status
from engine.sampler import sample
from engine.scheduler import ScheduledStep, Scheduler
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE, KVCachePool, parse_memory
from model.llama import LlamaModel

log = logging.getLogger("nano_vllm.engine")


class QueueFullError(RuntimeError):
    """The waiting line is at --max-waiting."""


class BatchEngine:
    def __init__(self, config: EngineConfig, model: LlamaModel, tokenizer) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self._build_cache_and_scheduler()
        cfg = model.cfg
        self.metrics = EngineMetrics()
        self.metrics.add_gauges(self.stats)
        self.eos_token_ids = set(cfg.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(tokenizer.eos_token_id)

        self._lock = threading.Lock()  # guards _inbox and _aborts, filled by other threads
        self._inbox: deque[Request] = deque()
        self._aborts: set[str] = set()
        self._requests: dict[str, Request] = {}  # engine thread only
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-engine", daemon=True)

    def _build_cache_and_scheduler(self) -> None:
        """The paged KV pool, its allocator, the scheduler and the model runner.

        A method of its own so that baseline_server.py can keep K/V its own way and reuse
        the rest of the engine (queue, aborts, sampling, stop conditions, metrics)."""
        cfg, config = self.model.cfg, self.config
        dtype = self.model.embed_tokens.weight.dtype
        device = self.model.embed_tokens.weight.device
        num_blocks = config.num_blocks or KVCachePool.blocks_for_memory(
            parse_memory(config.kv_cache_memory), cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
            dtype)
        self.pool = KVCachePool(cfg.num_layers, num_blocks, cfg.num_kv_heads, cfg.head_dim,
                                dtype, device)
        self.allocator = BlockAllocator(num_blocks, config.enable_prefix_cache)
        self.kv = KVCacheManager(self.allocator)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_prefills_per_step)
        self.runner = ModelRunner(self.model, self.pool, config.attention)

    # --- called from other threads -------------------------------------------------------

    @property
    def max_tokens_per_request(self) -> int:
        """A request longer than this could never fit, even alone in the pool."""
        return min(self.allocator.num_usable * BLOCK_SIZE, self.model.cfg.max_position_embeddings)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def add_request(self, request: Request) -> None:
        with self._lock:
            if len(self._inbox) + len(self.scheduler.waiting) >= self.config.max_waiting:
                raise QueueFullError(
                    f"the server is at capacity ({self.config.max_waiting} requests waiting)")
            self._inbox.append(request)
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        """Cancel a request (e.g. its client went away); its blocks are freed next step."""
        with self._lock:
            self._aborts.add(request_id)
        self._wakeup.set()

    def stats(self) -> dict[str, int]:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting) + len(self._inbox),
            "blocks_total": self.allocator.num_usable,
            "blocks_used": self.allocator.num_used,
            "blocks_free": self.allocator.num_free - self.allocator.num_cached_free,
            "blocks_cached_free": self.allocator.num_cached_free,
        }

    # --- the engine thread -----------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._inbox or self._aborts or self.scheduler.has_work():
                try:
                    self.step()
                except Exception as exc:  # outside the model run: fail everyone in flight
                    log.exception("engine step failed outside the model run")
                    for request in list(self._requests.values()):
                        self._finish(request, "error", f"internal error in the engine: {exc}")
            else:
                self._wakeup.wait(timeout=1.0)
                self._wakeup.clear()  # anything that arrived meanwhile is seen above

    def _take_inbox(self) -> None:
        with self._lock:
            arrivals, self._inbox = self._inbox, deque()
            aborts, self._aborts = self._aborts, set()
        for request in arrivals:
            self._requests[request.request_id] = request
            self._detok[request.request_id] = IncrementalDetokenizer(
                self.tokenizer, request.prompt_token_ids, request.params.stop)
            self.scheduler.add(request)
        for request_id in aborts:
            if request_id in self._requests:
                self._finish(self._requests[request_id], "abort")
        timeout = self.config.request_timeout
        if timeout is not None:
            now = time.monotonic()
            for request in list(self._requests.values()):
                if now - request.arrival_time > timeout:
                    self._finish(request, "error", f"request timed out after {timeout:g} s")

    def step(self) -> None:
        """One round: schedule, run the model once, sample, hand out tokens."""
        self._take_inbox()
        scheduled = self.scheduler.schedule()
        self.metrics.on_schedule(scheduled)
        if not scheduled.work:
            time.sleep(0.001)  # nothing fits yet (can only be momentary)
            return
        try:
            new_tokens = self._run(scheduled)
        except Exception as exc:  # a failed step must not take the server down
            log.exception("engine step failed; failing the %d requests in it", len(scheduled.work))
            for request, _ in scheduled.work:
                self._finish(request, "error", f"internal error in the engine: {exc}")
            return
        now = time.monotonic()
        for request, token in new_tokens:
            self._append_token(request, token, now)

    def _run(self, scheduled: ScheduledStep) -> list[tuple[Request, int]]:
        steps, sampled = [], []
        for request, n in scheduled.work:
            start = request.num_computed_tokens
            reaches_end = start + n == request.num_tokens
            steps.append(SequenceStep(request.token_ids[start:start + n], start,
                                      request.blocks.block_table, reaches_end))
            if reaches_end:
                sampled.append(request)
        logits = self.runner.run(steps)
        for request, n in scheduled.work:
            request.num_computed_tokens += n
            self.kv.cache_full_blocks(request.blocks, request.token_ids,
                                      request.num_computed_tokens)
        if not sampled:
            return []
        tokens = sample(logits, [r.params for r in sampled], [r.generator for r in sampled])
        return list(zip(sampled, tokens))

    def _append_token(self, request: Request, token: int, now: float) -> None:
        request.token_ids.append(token)
        self.metrics.on_token(request, now)
        p = request.params
        n_out = request.num_output_tokens
        detok = self._detok[request.request_id]
        reason = None
        # A stop token ends the request only once min_tokens tokens came before it.
        if n_out > p.min_tokens and (
                token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)):
            reason = "stop"  # the stop token itself is not part of the text
        else:
            detok.add(request.token_ids)
            if detok.stopped:
                reason = "stop"
            elif n_out >= p.max_tokens:
                reason = "length"
        if reason is not None:
            self._finish(request, reason)
        else:
            request.on_output(RequestOutput(request.request_id, detok.take(final=False), [token],
                                            num_output_tokens=n_out))

    def _finish(self, request: Request, reason: str, error: str | None = None) -> None:
        if request.status is Status.FINISHED:
            return
        self.scheduler.finish(request)
        request.finish_reason = reason
        self._requests.pop(request.request_id, None)
        detok = self._detok.pop(request.request_id)
        last = request.token_ids[-1:] if request.num_output_tokens else []
        self.metrics.on_finish(request)
        request.on_output(RequestOutput(
            request.request_id, detok.take(final=True) if error is None else "",
            last if reason in ("stop", "length") else [], finished=True, finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens, error=error))

    def describe(self) -> str:
        """One line for the startup message."""
        return (f"{self.runner.device}, {self.stats()['blocks_total']} KV blocks of 16 tokens, "
                f"prefix cache {'on' if self.config.enable_prefix_cache else 'off'}, "
                f"{self.runner.attention_backend} attention")


def load_engine(config: EngineConfig, engine_class: type[BatchEngine] = BatchEngine) -> BatchEngine:
    """Prepare or find the model, load it and its tokenizer, and build an engine
    (of `engine_class`: baseline_server.py passes its own)."""
    from transformers import AutoTokenizer

    from model.loader import load_model, pick_device, pick_dtype
    from model.prepare import resolve_model_dir

    model_dir = resolve_model_dir(config.model)
    device = pick_device(config.device)
    log.info("loading %s on %s (%s)", model_dir, device, config.dtype)
    model = load_model(model_dir, device, pick_dtype(config.dtype))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.set_grad_enabled(False)
    return engine_class(config, model, tokenizer)
