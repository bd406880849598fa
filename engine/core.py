"""One engine step: schedule, execute, update from the output.

An engine core owns the requests that are seated or waiting, their KV cache, and the
model run. `PagedEngineCore` is nano-vLLM's (paged KV, prefix cache, chunked prefill,
preemption); baseline_server.py composes another from the same parts. The engine
thread (batch_engine.py) drives either through the `EngineCore` protocol.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from engine.config import EngineConfig
from engine.cpu_load import ContentionWatch
from engine.model_runner import ModelRunner, ThreadPolicy
from engine.request import FinishReason, Request
from engine.scheduler import Scheduler
from engine.spec_decode import describe_speculation
from engine.step_types import RequestUpdate
from kvcache.block_allocator import BlockAllocator
from kvcache.groups import KVCacheGroups
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE, KVCachePool, parse_memory
from model.llama import LlamaModel

log = logging.getLogger("nano_vllm.engine")


class EngineStats(TypedDict):
    """Counts read by /metrics and the tests: free + used + cached_free = total blocks."""

    running: int
    waiting: int
    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached_free: int


@dataclass
class StepResult:
    """What one step did: each request's new tokens, and counts for the metrics."""

    updates: list[RequestUpdate] = field(default_factory=list)
    num_scheduled_tokens: int = 0  # 0: nothing could run this step
    num_prompt_tokens: int = 0
    num_preempted: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    # Speculative decoding: (drafted, accepted) for each request that verified drafts.
    drafts: list[tuple[int, int]] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)  # the model run failed for these
    error: str | None = None
    embedded_inputs: int = 0  # an embedding model's inputs done (engine/embedding_core.py)


class EngineCore(Protocol):
    max_tokens_per_request: int

    def add(self, request: Request) -> None: ...

    def step(self) -> StepResult: ...

    def finish(self, request: Request, reason: FinishReason) -> None: ...

    def has_work(self) -> bool: ...

    def num_waiting_tokens(self) -> int:
        """Prompt tokens of the waiting line still to compute (called on the engine thread)."""
        ...

    def stats(self) -> EngineStats: ...

    def describe(self) -> str: ...


AUTO_KV_FRACTION = 0.4  # --kv-cache-memory auto: this share of the free memory ...
AUTO_KV_CEILING = 2 * 1024**3  # ... up to this much


def kv_cache_bytes(text: str) -> int:
    """--kv-cache-memory: a size ("2GiB"), a share of the memory free now, after the
    weights loaded ("40%"), or "auto" (AUTO_KV_FRACTION of it, at most AUTO_KV_CEILING)."""
    from model.memory import GIB, available_bytes

    text = text.strip()
    if text != "auto" and not text.endswith("%"):
        return parse_memory(text)
    fraction = AUTO_KV_FRACTION if text == "auto" else float(text[:-1]) / 100
    if not 0 < fraction <= 1:
        raise ValueError(f"--kv-cache-memory {text}: a share must be above 0% and at most 100%")
    free = available_bytes()
    if free is None:  # nothing says what is free: the ceiling
        return AUTO_KV_CEILING
    budget = int(free * fraction)
    if text == "auto":
        budget = min(budget, AUTO_KV_CEILING)
    if budget < 64 * 1024**2:
        raise MemoryError(f"--kv-cache-memory {text}: only {free / GIB:.2f} GiB is free after "
                          "the weights loaded, too little for a KV cache; free memory or "
                          "give --kv-cache-memory a size")
    return budget


class PagedEngineCore:
    def __init__(self, config: EngineConfig, model: LlamaModel,
                 eos_token_ids: Collection[int]) -> None:
        cfg = model.cfg
        dtype, device = model.norm.weight.dtype, model.norm.weight.device
        # One group of all layers, or (sliding windows) groups that each hold group_size
        # layers: a block then takes 1/num_groups of a whole-model block's memory, and
        # --num-blocks N is the memory of N blocks of all layers.
        groups = (KVCacheGroups.from_windows(cfg.layer_windows()) if config.hybrid_kv_cache
                  else KVCacheGroups.single(cfg.num_layers))
        num_blocks = (config.num_blocks * groups.num_groups if config.num_blocks else
                      KVCachePool.blocks_for_memory(kv_cache_bytes(config.kv_cache_memory),
                                                    groups.group_size, cfg.num_kv_heads,
                                                    cfg.head_dim, dtype))
        self.config = config
        self.groups = groups
        self.pool = KVCachePool(cfg.num_layers, num_blocks, cfg.num_kv_heads, cfg.head_dim,
                                dtype, device, groups)
        self.allocator = BlockAllocator(num_blocks, config.enable_prefix_cache)
        self.kv = KVCacheManager(self.allocator, groups)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.max_prefills_per_step, eos_token_ids,
                                   config.scheduling_policy, config.priority_aging,
                                   config.speculative)
        most = config.threads or len(os.sched_getaffinity(0))
        threads = ThreadPolicy(most, config.single_thread_below,
                               watch=ContentionWatch(most) if config.yield_cores else None)
        self.runner = ModelRunner(model, self.pool, config.attention, threads,
                                  config.decode_stack)
        # A request longer than this could never fit, even alone in the pool (counted as if
        # every group kept every block: a sliding group's peak while it prefills a chunk).
        self.max_tokens_per_request = min(
            self.allocator.num_usable // groups.num_groups * BLOCK_SIZE,
                                          cfg.max_position_embeddings)

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def num_waiting_tokens(self) -> int:
        return sum(r.num_tokens - r.num_computed_tokens for r in self.scheduler.waiting)

    def finish(self, request: Request, reason: FinishReason) -> None:
        self.scheduler.finish(request, reason)

    def step(self) -> StepResult:
        scheduled = self.scheduler.schedule()
        result = StepResult(
            num_scheduled_tokens=scheduled.num_tokens,
            num_prompt_tokens=scheduled.num_prompt_tokens,
            num_preempted=len(scheduled.preempted),
            prefix_queried_tokens=scheduled.prefix_queried_tokens,
            prefix_hit_tokens=scheduled.prefix_hit_tokens)
        if not scheduled.scheduled:
            return result
        try:
            output = self.runner.execute(scheduled)
        except Exception as exc:  # a failed run fails its requests, not the server
            log.exception("engine step failed; failing the %d requests in it",
                          len(scheduled.scheduled))
            result.failed = scheduled.requests()
            result.error = f"internal error in the engine: {exc}"
            return result
        result.drafts = [(len(entry.draft_token_ids), len(output.tokens(entry.request_id)) - 1)
                         for entry in scheduled.drafting()]
        result.updates = self.scheduler.update_from_output(scheduled, output)
        return result

    def stats(self) -> EngineStats:
        a = self.allocator
        return EngineStats(running=len(self.scheduler.running),
                           waiting=len(self.scheduler.waiting), blocks_total=a.num_usable,
                           blocks_used=a.num_used, blocks_free=a.num_free - a.num_cached_free,
                           blocks_cached_free=a.num_cached_free)

    def describe(self) -> str:
        threads = self.runner.threads
        tokens = self.allocator.num_usable // self.groups.num_groups * BLOCK_SIZE
        weights = sum(t.numel() * t.element_size()
                      for t in (*self.runner.model.parameters(), *self.runner.model.buffers()))
        return (f"{self.runner.device}, weights {weights / 1024**3:.2f} GiB, "
                f"{self.allocator.num_usable} KV blocks of {BLOCK_SIZE} "
                f"tokens{self._describe_groups()} ({tokens:,} tokens in "
                f"{self.pool.nbytes / 1024**3:.2f} GiB), prefix cache "
                f"{'on' if self.config.enable_prefix_cache else 'off'}, "
                f"{self.runner.attention_backend} attention, {self.runner.matmul_path} matmuls, "
                f"{'decode layers in one C++ call, ' if self.runner.decode_stack else ''}"
                + describe_threads(threads.max_threads, threads.single_below)
                + (", fewer while other processes hold cores"
                   if threads.watch is not None and threads.watch.enabled else "")
                + (f", {describe_speculation(self.config.speculative)}"
                   if self.config.speculative else ""))

    def _describe_groups(self) -> str:
        groups = self.groups
        return f" ({groups.describe()})" if groups.num_groups > 1 else ""


def describe_threads(most: int, single_below: int) -> str:
    """How many threads a step uses, for the start-up line."""
    if most == 1:
        return "1 thread"
    if single_below == 0:
        return f"{most} threads every step"
    return f"up to {most} threads (1 for steps below {single_below} tokens)"
