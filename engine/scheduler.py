"""Who computes what in the next step, under a seat limit and a token budget.

Each step the seated (running) requests go first, in the order they were seated:
a decode costs one token of the budget; a prompt still being prefilled takes
as much as is left, in chunks, over several steps if need be. Then requests are
seated from the front of the waiting line while seats, budget and KV blocks
allow, each starting after its longest cached prefix.

Blocks are taken as a sequence grows, not reserved up front. When a running
sequence needs a block and none is free, the most recently seated request is
preempted: its blocks are released (full ones stay findable in the prefix
cache), and it returns to the front of the line to be recomputed later.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.request import Request, Status
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE


@dataclass
class ScheduledStep:
    work: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens to compute)
    preempted: list[Request] = field(default_factory=list)
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache this step
    prefix_hit_tokens: int = 0  # ... and found there

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefills_per_step: int = 0) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefills_per_step = max_prefills_per_step or max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.max_num_batched_tokens

        for request in list(self.running):
            if budget == 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._make_room(request, request.num_computed_tokens + n, step):
                continue
            self.kv.grow(request.blocks, request.num_computed_tokens + n)
            step.work.append((request, n))
            budget -= n

        # Seat newcomers, but not in a step that had to preempt: the pool is full.
        seated = 0
        while (self.waiting and not step.preempted and budget > 0
               and len(self.running) < self.max_num_seqs and seated < self.max_prefills_per_step):
            request = self.waiting[0]
            hit = self.kv.find_cached_prefix(request.token_ids)
            cached = len(hit.block_table) * BLOCK_SIZE
            n = min(request.num_tokens - cached, budget)
            if not self.kv.can_grow(hit, cached + n):
                break
            self.waiting.popleft()
            self.kv.acquire(hit)
            self.kv.grow(hit, cached + n)
            request.blocks = hit
            step.prefix_queried_tokens += request.num_tokens
            step.prefix_hit_tokens += cached
            request.num_computed_tokens = cached
            if request.scheduled_time is None:
                request.scheduled_time = time.monotonic()
                request.num_cached_tokens = cached
            request.status = Status.RUNNING
            self.running.append(request)
            step.work.append((request, n))
            budget -= n
            seated += 1
        return step

    def _make_room(self, request: Request, num_tokens: int, step: ScheduledStep) -> bool:
        """Preempt from the most recently seated until `request` can hold num_tokens.
        False if `request` itself had to go."""
        while not self.kv.can_grow(request.blocks, num_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            step.preempted.append(victim)
            if victim is request:
                return False
        return True

    def preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.release(request.blocks)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = Status.WAITING
        self.waiting.appendleft(request)

    def finish(self, request: Request) -> None:
        """Unseat (or unqueue) a request for good and release its blocks."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.kv.release(request.blocks)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.status = Status.FINISHED
