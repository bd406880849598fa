"""Every K/V slot a step reads holds the K/V of the right tokens: the scheduler and the KV
cache manager driven at random (arrivals sharing system prompts, samples that fork, drafts
accepted or not, aborts, preemption on a small pool, one or three KV cache groups), with a
pool that holds, for each slot, which prefix its K/V would be computed from.

A slot written at position p of a sequence holds the identity of the sequence's tokens up to
p. Each step runs as the runner does: the queued block copies first (every source read before
any destination is written), then each scheduled request writes the slots of the tokens it
computes; then every slot each computing request's attention reads (all positions before its
last, or those its window sees) must hold its own tokens' identity. A prefix-cache hit, a
fork's shared blocks and a copied partial block all pass only if they hand over the K/V of
the same tokens, written before the step that reads them.
"""

from __future__ import annotations

import random

import pytest

from engine.request import FinishReason, Request, SamplingParams
from engine.scheduler import Scheduler
from engine.spec_decode import SpeculativeConfig
from engine.step_types import RunnerOutput, SchedulerOutput
from kvcache.block_allocator import BlockAllocator
from kvcache.groups import KVCacheGroups
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE

SlotPool = dict[int, list[object]]  # block id -> what each slot's K/V was computed from


def identity(tokens: list[int], position: int) -> tuple[int, ...]:
    return tuple(tokens[:position + 1])


def slots(pool: SlotPool, block: int) -> list[object]:
    return pool.setdefault(block, [None] * BLOCK_SIZE)


def run_step(pool: SlotPool, step: SchedulerOutput, windows: list[int | None]) -> None:
    """The step's copies and writes on `pool`, then a check of every slot it reads."""
    sources = [list(slots(pool, source)) for source, _ in step.block_copies]
    for (_, destination), held in zip(step.block_copies, sources, strict=True):
        pool[destination] = held
    computing = [e for e in step.scheduled.values() if e.num_tokens]
    for entry in computing:
        tokens = [*entry.request.token_ids, *entry.draft_token_ids]
        start = entry.request.num_computed_tokens
        for position in range(start, start + entry.num_tokens):
            for table in entry.request.blocks.tables:
                slots(pool, table[position // BLOCK_SIZE])[position % BLOCK_SIZE] = (
                    identity(tokens, position))
    for entry in computing:
        tokens = [*entry.request.token_ids, *entry.draft_token_ids]
        start = entry.request.num_computed_tokens
        for group, (table, window) in enumerate(zip(entry.request.blocks.tables, windows,
                                                    strict=True)):
            first = 0 if window is None else max(0, start - window + 1)
            for position in range(first, start + entry.num_tokens):
                block = table[position // BLOCK_SIZE]
                held = slots(pool, block)[position % BLOCK_SIZE]
                assert held == identity(tokens, position), (
                    f"{entry.request_id} reads position {position} (group {group}, block "
                    f"{block}) holding another prefix's K/V; plan {step.plan()}, copies "
                    f"{step.block_copies}")


def made_up_output(rng: random.Random, step: SchedulerOutput) -> RunnerOutput:
    """Each drafting request keeps a random number of its drafts; each request that reaches
    its end gets a token (2 is the end of sequence)."""
    sampled = {}
    for request_id, entry in step.scheduled.items():
        if entry.draft_token_ids:
            kept = rng.randint(0, len(entry.draft_token_ids))
            sampled[request_id] = [*entry.draft_token_ids[:kept], rng.randint(3, 6)]
        elif entry.reaches_end:
            sampled[request_id] = [rng.randint(2, 6)]
    return RunnerOutput(sampled)


def random_run(seed: int) -> int:
    """One random run of 120 steps; how many requests started after part of a block."""
    rng = random.Random(seed)
    windows: list[int | None] = rng.choice([[None], [None, 40, 40]])
    groups = KVCacheGroups.from_windows(windows) if len(windows) > 1 else None
    speculative = SpeculativeConfig(disable_by_batch_size=8) if rng.random() < 0.5 else None
    s = Scheduler(KVCacheManager(BlockAllocator(rng.randint(12, 60)), groups),
                  rng.randint(3, 8), rng.choice([8, 16, 24, 64]), eos_token_ids=[2],
                  speculative=speculative)
    systems = [[rng.randint(3, 6) for _ in range(rng.randint(5, 60))] for _ in range(3)]
    pool: SlotPool = {}
    requests: list[Request] = []
    for _ in range(120):
        while len(requests) < 25 and rng.random() < 0.4:
            tokens = rng.choice(systems) + [rng.randint(3, 6) for _ in range(rng.randint(1, 20))]
            request = Request(f"r{len(requests)}", tokens, SamplingParams(
                temperature=0, max_tokens=rng.randint(1, 12)), on_output=lambda _: None)
            samples = min(rng.choice([1, 1, 2, 3]), s.max_num_seqs)
            request.pending_forks = [request.fork(i) for i in range(1, samples)]
            s.add(request)
            requests.append(request)
        if s.running and rng.random() < 0.1:
            s.finish(rng.choice(s.running), FinishReason.ABORT)
        if not s.has_work():
            continue
        step = s.schedule()
        run_step(pool, step, windows)
        s.update_from_output(step, made_up_output(rng, step))
        s.kv.allocator.check_invariants()
    return sum(1 for r in requests if r.num_cached_tokens % BLOCK_SIZE)


@pytest.mark.parametrize("seeds", [range(0, 75), range(75, 150)], ids=["0-74", "75-149"])
def test_every_slot_read_holds_its_own_tokens_kv(seeds):
    partial = sum(random_run(seed) for seed in seeds)
    print(f"seeds {seeds.start}-{seeds.stop - 1}: {partial} requests started inside a block")
    assert partial > 0  # the runs reach the partial-block copies they are meant to check
