"""The scheduler on a toy pool: token budget, chunked prefill, preemption, no leaks."""

from __future__ import annotations

from engine.logprobs import TokenLogprobs
from engine.request import FinishReason, Request, SamplingParams, Status
from engine.scheduler import Scheduler
from engine.step_types import RunnerOutput
from kvcache.block_allocator import BlockAllocator
from kvcache.groups import KVCacheGroups
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import BLOCK_SIZE

EOS = 2


def make(num_blocks: int = 10, max_num_seqs: int = 4, budget: int = 64,
         prefix_cache: bool = True) -> Scheduler:
    return Scheduler(KVCacheManager(BlockAllocator(num_blocks, prefix_cache)), max_num_seqs, budget,
                     eos_token_ids=[EOS])


def make_sliding(num_blocks: int = 40, window: int = 20, max_num_seqs: int = 4,
                 budget: int = 64, prefix_cache: bool = True) -> Scheduler:
    """A scheduler over three KV cache groups: one full-attention, two sliding-window."""
    groups = KVCacheGroups.from_windows([None, window, window])
    return Scheduler(KVCacheManager(BlockAllocator(num_blocks, prefix_cache), groups),
                     max_num_seqs, budget, eos_token_ids=[EOS])


def req(rid: str, n: int, start: int = 100, max_tokens: int = 16) -> Request:
    return Request(rid, list(range(start, start + n)),
                   SamplingParams(temperature=0, max_tokens=max_tokens), on_output=lambda out: None)


def run_step(s: Scheduler, token: int = 7) -> list[tuple[str, int]]:
    """Schedule, then report a made-up runner output: `token` for every request whose
    scheduled tokens reach its end, nothing for a prompt chunk that stops short."""
    step = s.schedule()
    sampled = {rid: [token] for rid, entry in step.scheduled.items() if entry.reaches_end}
    s.update_from_output(step, RunnerOutput(sampled))
    s.kv.allocator.check_invariants()
    return step.plan()


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
    s.finish(a, FinishReason.ABORT)
    assert b.num_tokens == 2 * BLOCK_SIZE + 1
    work = run_step(s)
    print("after a finished:", work)
    assert work == [("b", 1)]
    s.finish(b, FinishReason.ABORT)
    assert s.kv.allocator.num_used == 0


def test_no_block_is_leaked():
    s = make(num_blocks=12, max_num_seqs=3, budget=24)
    reqs = [req(f"r{i}", 9 + 5 * i, start=100 + 50 * i, max_tokens=6) for i in range(6)]
    for r in reqs:
        s.add(r)
    for _ in range(60):
        run_step(s)
        if not s.has_work():
            break
    assert all(r.finish_reason is FinishReason.LENGTH and r.num_output_tokens == 6 for r in reqs)
    assert all(r.status is Status.FINISHED for r in reqs)
    allocator = s.kv.allocator
    print(f"after all finished: used={allocator.num_used} free={allocator.num_free} "
          f"cached-free={allocator.num_cached_free}")
    assert allocator.num_used == 0 and allocator.num_free == allocator.num_usable


def test_one_at_a_time_prefill_seats_one_newcomer_per_step():
    s = Scheduler(KVCacheManager(BlockAllocator(40)), max_num_seqs=4, max_num_batched_tokens=64,
                  max_prefills_per_step=1)
    for i in range(3):
        s.add(req(f"r{i}", 5, start=100 * (i + 1)))
    steps = [run_step(s) for _ in range(3)]
    print("steps:", steps)
    assert steps == [[("r0", 5)], [("r0", 1), ("r1", 5)], [("r0", 1), ("r1", 1), ("r2", 5)]]


def test_update_from_output_ends_requests_on_eos_and_length_and_frees_their_blocks():
    s = make(num_blocks=10)
    eos_early = req("eos", 20, max_tokens=10)
    long = Request("long", list(range(300, 305)),
                   SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                   on_output=lambda out: None)
    s.add(eos_early)
    s.add(long)
    run_step(s)  # both prefilled: one token each
    assert eos_early.num_output_tokens == 1 and long.num_output_tokens == 1
    run_step(s, token=EOS)  # eos_early samples EOS; long reaches max_tokens with it
    print("finish reasons:", eos_early.finish_reason, long.finish_reason)
    assert eos_early.finish_reason is FinishReason.STOP
    assert long.finish_reason is FinishReason.LENGTH
    assert not s.has_work() and s.kv.allocator.num_used == 0
    # Only computed tokens were cached: eos_early's 20 prompt + 1 output give one full block.
    assert s.kv.allocator.num_cached_free == 1


def test_min_tokens_holds_back_eos():
    s = make()
    r = Request("r", list(range(100, 105)), SamplingParams(temperature=0, max_tokens=5,
                                                          min_tokens=2), on_output=lambda o: None)
    s.add(r)
    for _ in range(3):
        run_step(s, token=EOS)
    print("outputs:", r.token_ids[5:], r.finish_reason)
    assert r.token_ids[5:] == [EOS, EOS, EOS] and r.finish_reason is FinishReason.STOP


def test_several_tokens_per_step_stop_at_the_first_that_ends_the_request():
    """Room for speculative decoding: a list of tokens per request, cut at a stop."""
    s = make()
    r = req("r", 5, max_tokens=10)
    s.add(r)
    step = s.schedule()
    updates = s.update_from_output(step, RunnerOutput({"r": [11, 12, EOS, 13]}))
    print("update:", updates[0].new_token_ids, updates[0].finish_reason)
    assert updates[0].new_token_ids == [11, 12, EOS]
    assert updates[0].finish_reason is FinishReason.STOP and r.status is Status.FINISHED


def test_samples_fork_on_the_prompt_blocks_and_copy_only_the_partial_one():
    s = make(num_blocks=10)
    head = req("r", BLOCK_SIZE + 4, max_tokens=4)  # one full block, one with 4 tokens
    head.pending_forks = [head.fork(i) for i in (1, 2)]
    s.add(head)
    step = s.schedule()
    forks = {rid: entry.fork_of for rid, entry in step.scheduled.items() if entry.fork_of}
    print("first step:", step.plan(), "forks", forks)
    assert step.plan() == [("r", 20), ("r#1", 0), ("r#2", 0)]
    assert forks == {"r#1": "r", "r#2": "r"} and step.block_copies == []
    s.update_from_output(step, RunnerOutput({"r": [7], "r#1": [8], "r#2": [9]}))
    samples = [head, *s.running[1:]]
    tables = [r.blocks.block_table for r in samples]
    refs = [s.kv.allocator.blocks[b].ref_count for b in tables[0]]
    print("tables after the fork:", tables, "ref counts", refs)
    assert tables[0] == tables[1] == tables[2] and refs == [3, 3]
    assert [r.token_ids[-1] for r in samples] == [7, 8, 9]
    assert s.kv.allocator.num_used == 2  # the prompt is held once

    step = s.schedule()  # each writes position 20, in the shared partial block
    full, partial = tables[0][0], step.block_copies[0][0]
    tables = [r.blocks.block_table for r in samples]
    print("copies:", step.block_copies, "tables:", tables)
    assert [src for src, _ in step.block_copies] == [partial, partial]  # the last one keeps it
    assert {t[1] for t in tables} == {partial, *(dst for _, dst in step.block_copies)}
    assert all(t[0] == full for t in tables) and s.kv.allocator.blocks[full].ref_count == 3
    s.kv.allocator.check_invariants()
    for r in samples:
        s.finish(r, FinishReason.ABORT)
    assert s.kv.allocator.num_used == 0 and not s.has_work()
    s.kv.allocator.check_invariants()


def test_a_request_owing_prompt_logprobs_takes_from_the_cache_only_what_it_scored():
    s = make(num_blocks=20)
    s.add(req("warm", 40, max_tokens=1))
    run_step(s)  # 40 prompt tokens computed: two full blocks cached, then it ends
    scored = Request("scored", list(range(100, 140)),
                     SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0),
                     on_output=lambda out: None)
    s.add(scored)
    first = s.schedule()
    print("seated:", first.plan())
    assert first.plan() == [("scored", 40)]  # no hit
    # As if preempted after scoring its first 20 prompt tokens: one cached block is enough.
    s.preempt(scored)
    scored.prompt_logprobs = [None, *[TokenLogprobs(t, -1.0, []) for t in range(101, 120)]]
    again = s.schedule()
    print("after preemption, 20 scored:", again.plan())
    assert again.plan() == [("scored", 40 - BLOCK_SIZE)]
    assert scored.num_computed_tokens == BLOCK_SIZE


def three_priorities(policy: str) -> tuple[dict[str, Request], list[tuple[list[str], list[str]]]]:
    """low (priority 5) and mid (2) seated first, high (0) seated last, in a pool too small
    for all three to finish together. Runs them all to the end; returns the requests and,
    per step that preempted, (who was preempted, the waiting line after it)."""
    s = Scheduler(KVCacheManager(BlockAllocator(7)), 4, 64, eos_token_ids=[EOS],
                  scheduling_policy=policy)
    made = {rid: Request(rid, list(range(start, start + BLOCK_SIZE - 1)),
                         SamplingParams(temperature=0, max_tokens=40), on_output=lambda o: None,
                         arrival_time=arrival, priority=priority)
            for rid, priority, arrival, start in [("low", 5, 1.0, 100), ("mid", 2, 2.0, 200),
                                                  ("high", 0, 3.0, 300)]}
    s.add(made["low"])
    s.add(made["mid"])
    run_step(s)
    s.add(made["high"])  # arrives last, is seated last (there is room for its prompt)
    preemptions = []
    for _ in range(200):
        if not s.has_work():
            break
        step = s.schedule()
        sampled = {rid: [7] for rid, entry in step.scheduled.items() if entry.reaches_end}
        s.update_from_output(step, RunnerOutput(sampled))
        s.kv.allocator.check_invariants()
        if step.preempted:
            preemptions.append(([r.request_id for r in step.preempted],
                                [r.request_id for r in s.waiting]))
    assert all(r.finish_reason is FinishReason.LENGTH for r in made.values())
    assert s.kv.allocator.num_used == 0
    return made, preemptions


def test_priority_preempts_the_lowest_priority_first():
    """Under priority a shortage preempts the lowest priority (the largest number), not the
    most recently seated: high never loses its blocks, and each preempted request goes back
    to the line by its priority."""
    made, preemptions = three_priorities("priority")
    print("priority:", preemptions, {r: made[r].num_preemptions for r in made})
    assert made["high"].num_preemptions == 0
    assert made["low"].num_preemptions >= 1 and made["mid"].num_preemptions >= 1
    assert preemptions[0][0] == ["low"]  # the first shortage takes the worst one
    rank = {"high": 0, "mid": 1, "low": 2}
    for preempted, waiting in preemptions:
        assert "high" not in preempted
        assert waiting == sorted(waiting, key=rank.__getitem__)  # the line stays in order
    assert any(waiting == ["mid", "low"] for _, waiting in preemptions)


def test_fcfs_still_preempts_the_most_recently_seated():
    made, preemptions = three_priorities("fcfs")
    print("fcfs:", preemptions, {r: made[r].num_preemptions for r in made})
    assert preemptions[0][0] == ["high"]  # seated last, so preempted first, priority or not
    assert made["high"].num_preemptions >= 1 and made["low"].num_preemptions == 0


def shared(rid: str, own: int, shared_tokens: int = 3 * BLOCK_SIZE) -> Request:
    """A prompt of `shared_tokens` every such request has, then 4 tokens of its own."""
    tokens = list(range(1000, 1000 + shared_tokens)) + [own] * 4
    return Request(rid, tokens, SamplingParams(temperature=0, max_tokens=4),
                   on_output=lambda out: None)


def test_a_prefix_being_computed_is_waited_for_not_computed_twice():
    s = make(num_blocks=40, budget=32)
    s.add(shared("a", 1))
    s.add(shared("b", 2))
    steps = [run_step(s) for _ in range(3)]
    print("steps:", steps)
    assert steps[0] == [("a", 32)]
    # b's third block is a's next: b waits rather than compute it alongside a.
    assert steps[1] == [("a", 20)]
    assert steps[2] == [("a", 1), ("b", 4)]  # all 3 shared blocks from the cache
    assert s.running[1].num_cached_tokens == 3 * BLOCK_SIZE


def test_a_prompt_that_shares_part_of_a_block_starts_from_a_copy_of_it():
    """A shared prompt of 1.5 blocks: the second request takes the whole block from the
    cache and the 8 shared tokens of the next from a copy of the first request's block, and
    computes only its own 4."""
    s = make(num_blocks=40, budget=64)
    s.add(shared("a", 1, shared_tokens=BLOCK_SIZE + 8))
    assert run_step(s) == [("a", BLOCK_SIZE + 12)]
    s.add(shared("b", 2, shared_tokens=BLOCK_SIZE + 8))
    step = s.schedule()
    a, b = s.running
    print("plan:", step.plan(), "copies:", step.block_copies)
    assert step.plan() == [("a", 1), ("b", 4)]
    assert b.num_computed_tokens == b.num_cached_tokens == BLOCK_SIZE + 8
    assert step.prefix_hit_tokens == BLOCK_SIZE + 8
    assert b.blocks.block_table[0] == a.blocks.block_table[0]  # the whole block, shared
    assert step.block_copies == [(a.blocks.block_table[1], b.blocks.block_table[1])]  # copied
    s.update_from_output(step, RunnerOutput({"a": [7], "b": [7]}))
    s.kv.allocator.check_invariants()


def test_a_partial_block_is_copied_in_every_kv_cache_group():
    s = make_sliding(window=4 * BLOCK_SIZE)
    s.add(shared("a", 1, shared_tokens=BLOCK_SIZE + 8))
    run_step(s)
    s.add(shared("b", 2, shared_tokens=BLOCK_SIZE + 8))
    step = s.schedule()
    a, b = s.running
    assert step.plan() == [("a", 1), ("b", 4)]
    assert step.block_copies == [(ta[1], tb[1]) for ta, tb in zip(a.blocks.tables,
                                                                   b.blocks.tables)]


def test_a_partial_block_never_supplies_the_last_prompt_token():
    """A prompt that is the first 20 tokens of a seated one's: 19 come from it (the whole
    block and 3 of the next), the last is computed for its logits."""
    s = make(num_blocks=40, budget=64)
    s.add(req("a", 40))
    run_step(s)
    s.add(req("b", 20))
    step = s.schedule()
    print("plan:", step.plan(), "copies:", step.block_copies)
    assert step.plan() == [("a", 1), ("b", 1)]
    assert s.running[1].num_cached_tokens == 19 and len(step.block_copies) == 1


def test_without_the_prefix_cache_nothing_waits_for_a_prefix():
    s = make(num_blocks=40, budget=32, prefix_cache=False)
    s.add(shared("a", 1))
    s.add(shared("b", 2))
    assert run_step(s) == [("a", 32)]
    assert run_step(s) == [("a", 20), ("b", 12)]


def test_a_request_behind_one_that_waits_for_its_prefix_goes_first():
    s = make(num_blocks=40, budget=64)
    s.add(shared("a", 1, shared_tokens=5 * BLOCK_SIZE))
    s.add(shared("b", 2, shared_tokens=5 * BLOCK_SIZE))
    s.add(req("other", 10, start=5000))
    assert run_step(s) == [("a", 64)]
    assert run_step(s) == [("a", 20), ("other", 10)]  # b waits for a's blocks
    assert run_step(s) == [("a", 1), ("other", 1), ("b", 4)]


def test_seats_are_kept_for_a_request_waiting_for_its_prefix():
    s = make(num_blocks=40, max_num_seqs=2, budget=32)
    s.add(shared("a", 1))
    s.add(shared("b", 2))
    s.add(req("other", 10, start=5000))
    run_step(s)
    assert run_step(s) == [("a", 20)]  # the second seat is b's, not other's
    assert run_step(s) == [("a", 1), ("b", 4)]
    assert [r.request_id for r in s.waiting] == ["other"]


def test_sliding_groups_preempt_whole_and_resume_from_what_the_cache_kept():
    # 15 usable blocks for 3 groups: a (36 tokens) and b's first 28 take all of them; a
    # gives 2 back, and b's next chunk needs 6: b, the newest, yields.
    s = make_sliding(num_blocks=16, window=20, budget=64)
    a, b = req("a", 36, max_tokens=30), req("b", 60, start=1000, max_tokens=20)
    s.add(a)
    s.add(b)
    resumable = None
    for _ in range(200):
        if not s.has_work():
            break
        preemptions = b.num_preemptions
        run_step(s)
        held = [block for r in s.running for block in r.blocks.held()]
        assert s.kv.allocator.num_used == len(set(held))  # nothing given back is counted
        if b.num_preemptions > preemptions and resumable is None:
            assert b.blocks.tables == [[], [], []] and b.blocks.left_behind == [0, 0, 0]
            resumable = len(s.kv.find_cached_prefix(b.token_ids).hashes)
    print(f"b preempted {b.num_preemptions} times; a hit of {resumable} blocks after the first")
    assert b.num_preemptions > 0 and resumable
    assert (a.num_output_tokens, b.num_output_tokens) == (30, 20)
    assert s.kv.allocator.num_used == 0


def written_this_step(step) -> set[tuple[int, int]]:
    """(block, offset) of every K/V slot the step's forward pass writes, in every group."""
    slots = set()
    for entry in step.scheduled.values():
        start = entry.request.num_computed_tokens
        for p in range(start, start + entry.num_tokens):
            for table in entry.request.blocks.tables:
                slots.add((table[p // BLOCK_SIZE], p % BLOCK_SIZE))
    return slots


def assert_partial_copies_read_only_computed_kv(step, newcomer: Request) -> None:
    shared = newcomer.num_computed_tokens % BLOCK_SIZE
    written = written_this_step(step)
    for source, _ in step.block_copies:
        stale = [off for off in range(shared) if (source, off) in written]
        assert not stale, (f"block {source} copied for {newcomer.request_id}'s first {shared} "
                           f"tokens before this step writes its offsets {stale}")


def test_a_partial_block_is_not_copied_from_a_sample_forked_in_the_same_step():
    """a (n=2) computes its prompt's last 12 tokens, block 1, in the step that forks a#1
    (seated with num_computed_tokens = num_tokens); b, seated later in that step, must not
    copy block 1: the copy runs before the forward pass that writes it."""
    s = make(num_blocks=40, budget=BLOCK_SIZE)
    a = shared("a", 1, shared_tokens=BLOCK_SIZE + 8)
    a.pending_forks = [a.fork(1)]
    s.add(a)
    assert run_step(s) == [("a", BLOCK_SIZE)]  # block 0 computed and cached
    b = shared("b", 2, shared_tokens=BLOCK_SIZE + 8)
    s.add(b)
    step = s.schedule()
    print("plan:", step.plan(), "copies:", step.block_copies,
          "b computed:", b.num_computed_tokens)
    assert ("a#1", 0) in step.plan()
    assert_partial_copies_read_only_computed_kv(step, b)


def test_a_partial_block_is_not_copied_from_a_newcomer_forked_in_the_same_step():
    """The same when a (n=2) and b arrive together after z cached block 0: a is seated,
    computes block 1 and forks; b, seated next, must not copy block 1 from a#1."""
    s = make(num_blocks=40, budget=64, max_num_seqs=5)
    s.add(req("z", BLOCK_SIZE + 1, start=1000, max_tokens=1))  # caches block 0, then ends
    run_step(s)
    assert not s.running
    a = shared("a", 1, shared_tokens=BLOCK_SIZE + 8)
    a.pending_forks = [a.fork(1)]
    b = shared("b", 2, shared_tokens=BLOCK_SIZE + 8)
    s.add(a)
    s.add(b)
    step = s.schedule()
    print("plan:", step.plan(), "copies:", step.block_copies,
          "b computed:", b.num_computed_tokens)
    assert_partial_copies_read_only_computed_kv(step, b)
