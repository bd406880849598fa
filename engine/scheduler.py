"""Who computes what in the next step, and the bookkeeping once it has run.

`schedule()` decides; `update_from_output()` records what the model produced. Between
the two, nothing else touches a request's counts or blocks.

Each step the seated (running) requests go first, in the order they were seated: a
request has tokens computed (K/V in the cache) and tokens still to compute. A decode
has one left; a prompt being prefilled takes as much of the token budget as is left,
in chunks over several steps if need be. Then requests are seated from the front of the
waiting line while seats, budget and KV blocks allow, each starting after its longest
cached prefix.

Blocks are taken as a sequence grows, not reserved up front. When a running sequence
needs a block and none is free, the most recently seated request is preempted: its
blocks are released (full ones stay findable in the prefix cache), and it returns to
the front of the line to be recomputed later.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from engine.request import FinishReason, Request, RequestUpdate, Status
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE


@dataclass
class SchedulerOutput:
    """One step's plan: (request, tokens to compute) in batch order, plus what it cost."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache this step
    prefix_hit_tokens: int = 0  # ... and found there

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of this step that are (re)computed prompt, not decodes."""
        return sum(n for r, n in self.scheduled
                   if r.num_computed_tokens + n <= r.num_prompt_tokens)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefills_per_step: int = 0,
                 eos_token_ids: Collection[int] = ()) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefills_per_step = max_prefills_per_step or max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        for request in list(self.running):
            if budget == 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if self._make_room(request, request.num_computed_tokens + n, out):
                out.scheduled.append((request, n))
                budget -= n
        # Seat newcomers, but not in a step that had to preempt: the pool is full.
        seated = 0
        while (self.waiting and not out.preempted and budget > 0
               and len(self.running) < self.max_num_seqs and seated < self.max_prefills_per_step):
            n = self._seat(self.waiting[0], budget, out)
            if n == 0:
                break
            budget -= n
            seated += 1
        return out

    def _seat(self, request: Request, budget: int, out: SchedulerOutput) -> int:
        """Seat the front of the line after its cached prefix; tokens scheduled (0: no room)."""
        hit = self.kv.find_cached_prefix(request.token_ids)
        cached = len(hit.block_table) * BLOCK_SIZE
        n = min(request.num_tokens - cached, budget)
        if not self.kv.allocate_slots(hit, cached + n, new_prefix_hit=True):
            return 0
        self.waiting.popleft()
        request.blocks = hit
        request.num_computed_tokens = cached
        out.prefix_queried_tokens += request.num_tokens
        out.prefix_hit_tokens += cached
        if request.scheduled_time is None:
            request.scheduled_time = time.monotonic()
            request.num_cached_tokens = cached
        request.status = Status.RUNNING
        self.running.append(request)
        out.scheduled.append((request, n))
        return n

    def _make_room(self, request: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Give `request` slots for num_tokens, preempting from the most recently seated
        while the pool is short. False if `request` itself had to go."""
        while not self.kv.allocate_slots(request.blocks, num_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def update_from_output(self, scheduled: SchedulerOutput,
                           sampled_token_ids: list[list[int]]) -> list[RequestUpdate]:
        """Record a step that ran: advance computed counts, make newly full blocks findable,
        append each request's new tokens, and unseat those a stop token or length ended.

        sampled_token_ids[i] belongs to scheduled.scheduled[i] (empty for a prompt chunk that
        stops short of the prompt's end)."""
        updates = []
        for (request, n), new_tokens in zip(scheduled.scheduled, sampled_token_ids, strict=True):
            request.num_computed_tokens += n
            # Only computed tokens are final; sampled ones have no K/V yet.
            self.kv.cache_full_blocks(request.blocks, request.token_ids,
                                      request.num_computed_tokens)
            if not new_tokens:
                continue
            update = RequestUpdate(request, [])
            for token in new_tokens:
                update.new_token_ids.append(token)
                update.finish_reason = request.append_token(token, self.eos_token_ids)
                if update.finish_reason is not None:
                    self.finish(request, update.finish_reason)
                    break
            updates.append(update)
        return updates

    def preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.release(request.blocks)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = Status.WAITING
        self.waiting.appendleft(request)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Unseat (or unqueue) a request for good and release its blocks."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.kv.release(request.blocks)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
