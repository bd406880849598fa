"""The scheduler on a toy pool: token budget, chunked prefill, preemption, no leaks."""

from __future__ import annotations

from engine.request import Request, SamplingParams, Status
from engine.scheduler import Scheduler
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE


def make(num_blocks: int = 10, max_num_seqs: int = 4, budget: int = 64,
         prefix_cache: bool = True) -> Scheduler:
    return Scheduler(KVCacheManager(BlockAllocator(num_blocks, prefix_cache)), max_num_seqs, budget)


def req(rid: str, n: int, start: int = 0) -> Request:
    return Request(rid, list(range(start, start + n)), SamplingParams(temperature=0),
                   on_output=lambda out: None)


def run_step(s: Scheduler) -> list[tuple[str, int]]:
    """Schedule, then pretend the model ran: advance counts, cache blocks, add a token."""
    step = s.schedule()
    for r, n in step.work:
        r.num_computed_tokens += n
        s.kv.cache_full_blocks(r.blocks, r.token_ids, r.num_computed_tokens)
        if r.num_computed_tokens == r.num_tokens:
            r.token_ids.append(7)
    s.kv.allocator.check_invariants()
    return [(r.request_id, n) for r, n in step.work]


def test_budget_is_respected_and_long_prompts_are_chunked():
    s = make(num_blocks=40, budget=32)
    s.add(req("long", 70))
    s.add(req("short", 10, start=500))
    steps = [run_step(s) for _ in range(4)]
    print("steps:", steps)
    assert all(sum(n for _, n in work) <= 32 for work in steps)
    assert steps[0] == [("long", 32)]
    assert steps[1] == [("long", 32)]
    assert steps[2] == [("long", 6), ("short", 10)]  # the tail of the prompt, then a newcomer
    assert steps[3] == [("long", 1), ("short", 1)]  # both decoding


def test_seats_are_limited():
    s = make(num_blocks=40, max_num_seqs=2)
    for i in range(3):
        s.add(req(f"r{i}", 5, start=100 * i))
    run_step(s)
    assert [r.request_id for r in s.running] == ["r0", "r1"]
    assert [r.request_id for r in s.waiting] == ["r2"]


def test_newest_is_preempted_and_resumes_from_prefix_cache():
    s = make(num_blocks=6, budget=64)  # 5 usable blocks
    a, b = req("a", 2 * BLOCK_SIZE - 1), req("b", 2 * BLOCK_SIZE - 1, start=1000)
    s.add(a)
    s.add(b)
    run_step(s)  # both prefilled: 2 blocks each, one block free
    run_step(s)  # a and b decode at position 31: still inside block 2
    assert a.num_computed_tokens == 2 * BLOCK_SIZE
    run_step(s)  # a takes the last block for position 32; b needs one too -> b preempted
    print("running:", [r.request_id for r in s.running], "waiting:",
          [r.request_id for r in s.waiting])
    assert b.status is Status.WAITING and s.waiting[0] is b and b.num_preemptions == 1
    assert b.num_computed_tokens == 0 and b.blocks.block_table == []
    # b's two full blocks (31 prompt tokens + 1 computed output) stay findable: when room
    # returns, b recomputes only its newest token.
    s.finish(a)
    assert b.num_tokens == 2 * BLOCK_SIZE + 1
    work = run_step(s)
    print("after a finished:", work)
    assert work == [("b", 1)]
    s.finish(b)
    assert s.kv.allocator.num_used == 0


def test_no_block_is_leaked():
    s = make(num_blocks=12, max_num_seqs=3, budget=24)
    reqs = [req(f"r{i}", 9 + 5 * i, start=50 * i) for i in range(6)]
    for r in reqs:
        s.add(r)
    for _ in range(60):
        run_step(s)
        for r in list(s.running):
            if r.num_output_tokens >= 6:
                s.finish(r)
        if not s.has_work():
            break
    assert all(r.status is Status.FINISHED for r in reqs)
    allocator = s.kv.allocator
    print(f"after all finished: used={allocator.num_used} free={allocator.num_free} "
          f"cached-free={allocator.num_cached_free}")
    assert allocator.num_used == 0 and allocator.num_free == allocator.num_usable


def test_one_at_a_time_prefill_seats_one_newcomer_per_step():
    s = Scheduler(KVCacheManager(BlockAllocator(40)), max_num_seqs=4, max_num_batched_tokens=64,
                  max_prefills_per_step=1)
    for i in range(3):
        s.add(req(f"r{i}", 5, start=100 * i))
    steps = [run_step(s) for _ in range(3)]
    print("steps:", steps)
    assert steps == [[("r0", 5)], [("r0", 1), ("r1", 5)], [("r0", 1), ("r1", 1), ("r2", 5)]]
