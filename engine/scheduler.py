"""Who computes what in the next step, and the bookkeeping once it has run.

`schedule()` decides; `update_from_output()` records what the model produced. Between
the two, nothing else touches a request's counts or blocks.

Each step the seated (running) requests go first, in the order they were seated (under
--scheduling-policy priority, in the waiting line's order: best first, then as seated): a
request has tokens computed (K/V in the cache) and tokens still to compute. A decode
has one left; a prompt being prefilled takes as much of the token budget as is left,
in chunks over several steps if need be. Then requests are seated from the front of the
waiting line while seats, budget and KV blocks allow, each starting after its longest
cached prefix, and after as many tokens of the next block as a seated request has computed
alike (its block copied, so a system prompt ending inside a block is not computed again
for each user). A request whose next prompt block is still being computed by a seated one
(users arriving together with one system prompt) is passed over until that block is
cached, its seats kept for it; those behind it may go first.

Blocks are taken as a sequence grows, not reserved up front. When a running sequence
needs a block and none is free, a request is preempted: its blocks are released (full ones
stay findable in the prefix cache), and it returns to the line to be recomputed later. (With
sliding-window layers, each KV cache group takes its own blocks, all from one pool, and a
sliding group gives back the blocks its window has left behind after each step:
kvcache/kv_cache_manager.py.) Under
fcfs that is the most recently seated request, and it returns to the front of the line.
Under priority it is the one the line would seat last (the lowest priority, aged as in
waiting_queue.py, then the latest arrival; then the most recently seated), and it returns
to the line by its own key. Since the seated go in that same order, a request is never
preempted while one the line ranks below it keeps its blocks.

Several samples of one prompt (params.n) are one request until the step that computes
its prompt's end: then the others fork from it, taking its blocks by reference and its
last logits row for their first token, and run as requests of their own (a request
holds a seat for each sample it will fork).

With speculative decoding (spec_decode.py), a decoding request may also be scheduled with
drafted tokens after its last one, if slots for them are free without preempting anyone;
the drafts it rejects are not counted as computed, and blocks holding only them are freed.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from engine.logprobs import TokenLogprobs
from engine.request import FinishReason, Request, Status
from engine.spec_decode import SpeculativeConfig, can_speculate, note_drafts, propose_ngram
from engine.step_types import RequestUpdate, RunnerOutput, SchedulerOutput
from engine.waiting_queue import PriorityQueue, make_waiting_queue
from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks
from kvcache.pool import BLOCK_SIZE, DUMMY_BLOCK


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefills_per_step: int = 0,
                 eos_token_ids: Collection[int] = (), scheduling_policy: str = "fcfs",
                 priority_aging: float = 10.0,
                 speculative: SpeculativeConfig | None = None) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefills_per_step = max_prefills_per_step or max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)
        # fcfs: a deque; priority: the same operations, ordered (engine/waiting_queue.py)
        self.waiting = make_waiting_queue(scheduling_policy, priority_aging)
        self.speculative = speculative
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        if 1 + len(request.pending_forks) > self.max_num_seqs:
            raise ValueError(f"{1 + len(request.pending_forks)} samples of one prompt need "
                             f"more than the {self.max_num_seqs} seats")
        self.waiting.append(request)

    def seats_taken(self) -> int:
        """Seated requests, plus the samples they will fork."""
        return sum(1 + len(r.pending_forks) for r in self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        speculate = (self.speculative is not None
                     and self.seats_taken() <= self.speculative.disable_by_batch_size)
        for request in self._running_order():
            if budget == 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if speculate and self._schedule_drafts(request, budget, out):
                budget -= out.scheduled[request.request_id].num_tokens
                continue
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if self._make_room(request, request.num_computed_tokens + n, out):
                self._schedule(request, n, out)
                budget -= n
        self._seat_newcomers(budget, out)
        out.block_copies = self.kv.take_block_copies()
        return out

    def _seat_newcomers(self, budget: int, out: SchedulerOutput) -> None:
        """Seat from the front of the line while seats, budget and blocks allow; not in a
        step that had to preempt (the pool is full). A request whose next prompt block a
        seated request is still computing is passed over, its seats kept for it: seated now,
        it would compute that block a second time; once the block is cached it finds it."""
        seated = kept = 0
        for request in list(self.waiting):
            seats = 1 + len(request.pending_forks)
            if (out.preempted or budget == 0 or seated == self.max_prefills_per_step
                    or self.seats_taken() + kept + seats > self.max_num_seqs):
                return
            looked_up = request.token_ids[:request.prefix_cache_limit() + 1]
            hit = self.kv.find_cached_prefix(looked_up)
            if self._block_in_flight(request, len(hit.block_table)):
                kept += seats
                continue
            n = self._seat(request, len(looked_up), hit, budget, out)
            if n == 0:
                return
            budget -= n
            seated += 1

    def _block_in_flight(self, request: Request, cached_blocks: int) -> bool:
        """Whether a seated request with the same tokens up to the end of the block after
        `request`'s cached prefix has yet to compute that block (so to cache it)."""
        end = (cached_blocks + 1) * BLOCK_SIZE
        if not self.kv.allocator.enable_prefix_cache or request.prefix_cache_limit() < end:
            return False
        prefix = request.token_ids[:end]
        return any(r.num_computed_tokens < end <= r.num_tokens and r.token_ids[:end] == prefix
                   for r in self.running)

    def _running_order(self) -> list[Request]:
        """The order the seated go in: as seated, or (priority) the line's order, best first
        (a stable sort: as seated among equals). A shortage then preempts only requests
        not yet scheduled in the step (see _victim)."""
        if isinstance(self.waiting, PriorityQueue):
            return sorted(self.running, key=self.waiting.key)
        return list(self.running)

    def _victim(self, request: Request, out: SchedulerOutput) -> Request:
        """Whom to preempt so that `request` can grow: the most recently seated (fcfs), or
        (priority) the one the line would seat last, then the most recently seated, of
        `request` and those not yet scheduled in this step (which rank no better)."""
        line = self.waiting
        if not isinstance(line, PriorityQueue):
            return self.running[-1]
        scheduled = out.scheduled
        candidates = [(line.key(r), seat, r) for seat, r in enumerate(self.running)
                      if r is request or r.request_id not in scheduled]
        return max(candidates, key=lambda c: c[:2])[2]

    def _schedule_drafts(self, request: Request, budget: int, out: SchedulerOutput) -> bool:
        """Schedule a decoding request with its last token and drafts, if it has drafts and
        they fit in the budget and in free blocks (never preempting for them)."""
        assert self.speculative is not None
        if (request.num_tokens - request.num_computed_tokens != 1 or request.pending_forks
                or not can_speculate(request)):
            return False
        if request.draft_pause:
            request.draft_pause -= 1
            return False
        # No drafts past max_tokens (the verified step adds one token of its own).
        room = min(request.params.max_tokens - request.num_output_tokens - 1, budget - 1)
        if request.thinking is not None:  # nor past a thinking budget
            room = min(room, request.thinking.draft_room())
        drafts = propose_ngram(request.token_ids, self.speculative, room)
        if not drafts:
            return False
        # Leave a block per seated request and KV cache group (each may need one this step),
        # so that drafts never make another request wait or be preempted.
        needed = self.kv.blocks_needed(request.blocks, request.num_tokens + len(drafts))
        if (self.kv.allocator.num_free - needed - self.kv.num_groups
                < self.kv.num_groups * len(self.running)
                or not self.kv.allocate_slots(request.blocks, request.num_tokens + len(drafts),
                                              write_from=request.num_computed_tokens)):
            return False
        self._schedule(request, 1 + len(drafts), out, drafts)
        return True

    def _partial_source(self, request: Request, hit: SequenceBlocks, looked_up: int,
                        out: SchedulerOutput) -> tuple[Request | None, int]:
        """The seated request whose computed K/V holds the most of `request`'s tokens after
        its cached whole blocks (`hit`), within the block that follows (a whole block would
        be cached), and how many: (None, 0) if none does. Never the last of the `looked_up`
        tokens: its logits are needed."""
        cached = len(hit.block_table) * BLOCK_SIZE
        want = request.token_ids[cached:min(cached + BLOCK_SIZE - 1, looked_up - 1)]
        if not want or not self.kv.allocator.enable_prefix_cache:
            return None, 0
        index = cached // BLOCK_SIZE
        # A block this step's copies have yet to fill holds nothing yet (copies read first).
        filling = {destination for _, destination in self.kv.block_copies}
        best, most = None, 0
        for seated in self.running:
            entry = out.scheduled.get(seated.request_id)
            if entry is not None and entry.fork_of is not None:
                continue  # forked this step: its prompt's K/V are written by this step's pass
            computed = min(seated.num_computed_tokens, seated.num_tokens)
            if (computed <= cached or seated.token_ids[cached] != want[0]
                    or any(t[index] in filling or t[index] == DUMMY_BLOCK
                           for t in seated.blocks.tables)
                    or not self._same_prefix(seated, request, hit)):
                continue
            theirs = seated.token_ids[cached:min(computed, cached + len(want))]
            same = next((i for i, (a, b) in enumerate(zip(theirs, want)) if a != b), len(theirs))
            if same > most:
                best, most = seated, same
        return best, most

    @staticmethod
    def _same_prefix(seated: Request, request: Request, hit: SequenceBlocks) -> bool:
        """Whether `seated` begins with `request`'s cached whole blocks: by the hash chained
        over them all where `seated` has cached that many, else by the tokens."""
        index = len(hit.hashes)
        if index and len(seated.blocks.hashes) >= index:
            return seated.blocks.hashes[index - 1] == hit.hashes[-1]
        cached = len(hit.block_table) * BLOCK_SIZE
        return seated.token_ids[:cached] == request.token_ids[:cached]

    def _seat(self, request: Request, looked_up: int, hit: SequenceBlocks, budget: int,
              out: SchedulerOutput) -> int:
        """Seat a waiting request after its cached prefix `hit` (found among its first
        `looked_up` tokens), and after the first tokens of the next block if a seated
        request has computed them (a copy of its block); tokens scheduled (0: no room)."""
        source, shared = self._partial_source(request, hit, looked_up, out)
        cached = len(hit.block_table) * BLOCK_SIZE + shared
        n = min(request.num_tokens - cached, budget)
        if not self.kv.allocate_slots(hit, cached + n, new_prefix_hit=True,
                                      partial_from=source.blocks if source else None):
            return 0
        if request is self.waiting[0]:
            self.waiting.popleft()
        else:
            self.waiting.remove(request)
        request.blocks = hit
        request.num_computed_tokens = cached
        out.prefix_queried_tokens += looked_up
        out.prefix_hit_tokens += cached
        if request.scheduled_time is None:
            request.scheduled_time = time.monotonic()
            request.num_cached_tokens = cached
        request.status = Status.RUNNING
        self.running.append(request)
        self._schedule(request, n, out)
        return n

    def _schedule(self, request: Request, n: int, out: SchedulerOutput,
                  drafts: list[int] | None = None) -> None:
        """Put `request` in this step, and fork its waiting samples if it ends its prompt."""
        out.add(request, n, drafts)
        if request.pending_forks and request.num_computed_tokens + n == request.num_tokens:
            self._fork(request, out)

    def _fork(self, request: Request, out: SchedulerOutput) -> None:
        """Seat request's samples right after it: its blocks by reference, its prompt
        computed (by it, in this very step), its last logits row to sample from."""
        seat = self.running.index(request) + 1
        for sample in request.pending_forks:
            sample.blocks = self.kv.fork(request.blocks)
            sample.num_computed_tokens = sample.num_tokens
            sample.scheduled_time = request.scheduled_time
            sample.status = Status.RUNNING
            self.running.insert(seat, sample)
            seat += 1
            out.add(sample, 0, fork_of=request.request_id)
        request.pending_forks = []

    def _make_room(self, request: Request, num_tokens: int, out: SchedulerOutput) -> bool:
        """Give `request` slots for num_tokens, preempting (see _victim) while the pool is
        short. False if `request` itself had to go."""
        while not self.kv.allocate_slots(request.blocks, num_tokens,
                                         write_from=request.num_computed_tokens):
            victim = self._victim(request, out)
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def update_from_output(self, scheduled: SchedulerOutput,
                           output: RunnerOutput) -> list[RequestUpdate]:
        """Record a step that ran: advance computed counts, make newly full blocks findable,
        keep prompt logprobs, append each request's new tokens, and unseat those a stop
        token or length ended (or, with max_tokens 0, the end of the prompt).

        output is keyed by request id, as scheduled.scheduled (no sampled tokens for a prompt
        chunk that stops short of the prompt's end)."""
        updates = []
        for request_id, entry in scheduled.scheduled.items():
            request, n, drafts = entry.request, entry.num_tokens, entry.draft_token_ids
            computed = request.num_computed_tokens
            sampled = output.tokens(request_id)
            # Drafts after the first rejected one were computed in vain: not counted.
            rejected = len(drafts) - (len(sampled) - 1) if drafts else 0
            if drafts:
                note_drafts(request, accepted=len(drafts) - rejected)
            request.num_computed_tokens += n - rejected
            request.num_computed_prompt_tokens += max(
                min(request.num_computed_tokens, request.num_prompt_tokens) - computed, 0)
            # Only computed tokens are final; sampled ones have no K/V yet (and accepted
            # drafts are not in token_ids yet: their blocks are made findable next step).
            final = min(request.num_computed_tokens, request.num_tokens)
            self.kv.cache_full_blocks(request.blocks, request.token_ids, final)
            self.kv.free_left_behind(request.blocks, final)
            prompt_logprobs = output.prompt_logprobs.get(request_id)
            if prompt_logprobs:
                assert request.prompt_logprobs is not None
                request.prompt_logprobs.extend(prompt_logprobs)
            if (request.params.max_tokens == 0
                    and request.num_computed_tokens >= request.num_prompt_tokens):
                self.finish(request, FinishReason.LENGTH)
                updates.append(RequestUpdate(request, [], FinishReason.LENGTH))
            elif sampled:
                updates.append(self._append(request, sampled, output.logprobs.get(request_id, [])))
            if rejected and request.status is Status.RUNNING:
                self.kv.free_blocks_after(request.blocks, request.num_tokens)
        return updates

    def _append(self, request: Request, new_tokens: list[int],
                logprobs: list[TokenLogprobs]) -> RequestUpdate:
        """Append new tokens up to the first that ends the request."""
        update = RequestUpdate(request, [])
        for k, token in enumerate(new_tokens):
            token_logprobs = logprobs[k] if logprobs else None
            update.new_token_ids.append(token)
            if token_logprobs is not None:
                update.logprobs.append(token_logprobs)
            update.finish_reason = request.append_token(token, self.eos_token_ids,
                                                        token_logprobs)
            if update.finish_reason is not None:
                self.finish(request, update.finish_reason)
                break
        return update

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
        elif request in self.waiting:  # not a sample still waiting to be forked
            self.waiting.remove(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
