"""Engine snapshots for the dashboard, on a toy pool: shared prefixes, cached-free blocks
after a request ends, a preempted request, and when snapshots are taken at all."""

from __future__ import annotations

import time

from engine.request import FinishReason, Request, SamplingParams, Status
from engine.snapshot import EngineSnapshot, SnapshotBoard, StepRecord, take_snapshot
from kvcache.pool import BLOCK_SIZE
from tests.engine.test_scheduler import make, req, run_step


def with_prompt(rid: str, token_ids: list[int]) -> Request:
    return Request(rid, token_ids, SamplingParams(temperature=0, max_tokens=16),
                   on_output=lambda out: None)


def check_against_pool(snapshot: EngineSnapshot, allocator) -> None:
    """What the snapshot derives must be what the allocator holds, block for block."""
    refs, owners = snapshot.grid()
    for view in snapshot.blocks():
        block = allocator.blocks[view.block_id]
        assert view.ref_count == block.ref_count, (view, block)
        assert refs[view.block_id] == (-1 if view.state == "cached" else view.ref_count)
        if view.owners:
            assert snapshot.requests[owners[view.block_id]].request_id == view.owners[0]
    states = [v.state for v in snapshot.blocks()]
    print("states:", {s: states.count(s) for s in ("used", "cached", "free")})
    assert states.count("used") == allocator.num_used
    assert states.count("cached") == allocator.num_cached_free


def test_blocks_shared_by_a_common_prefix_show_ref_count_two():
    s = make(num_blocks=20, budget=64)
    prefix = list(range(100, 100 + 2 * BLOCK_SIZE))  # two full blocks in common
    a = with_prompt("a", [*prefix, 7, 8, 9])
    s.add(a)
    run_step(s)  # a is prefilled: its two full blocks become findable
    b = with_prompt("b", [*prefix, 5, 6])
    s.add(b)
    run_step(s)  # b is seated on a's two blocks
    snapshot = take_snapshot(s)
    check_against_pool(snapshot, s.kv.allocator)
    shared = [v for v in snapshot.blocks() if v.ref_count == 2]
    print("shared:", shared)
    assert [v.block_id for v in shared] == a.blocks.block_table[:2] == b.blocks.block_table[:2]
    for i, view in enumerate(shared):
        assert view.owners == ("a", "b") and view.position == i and view.state == "used"
        assert view.block_hash == a.blocks.hashes[i]
        assert view.parent_hash == (a.blocks.hashes[i - 1] if i else None)
    assert snapshot.request("b").num_cached_tokens == 2 * BLOCK_SIZE
    # Each keeps a block of its own for the tail: held once.
    assert snapshot.block(a.blocks.block_table[2]).owners == ("a",)


def test_cached_free_blocks_after_a_request_ends():
    s = make(num_blocks=20, budget=64)
    a = req("a", 2 * BLOCK_SIZE + 3)
    s.add(a)
    run_step(s)
    full, tail = a.blocks.block_table[:2], a.blocks.block_table[2]
    s.finish(a, FinishReason.STOP)
    snapshot = take_snapshot(s)
    check_against_pool(snapshot, s.kv.allocator)
    assert snapshot.requests == ()
    # Freed tail first: the tail block holds nothing findable; the two full blocks stay
    # findable, the later one evicted first.
    assert snapshot.cached_free == (full[1], full[0])
    assert [snapshot.block(b).state for b in full] == ["cached", "cached"]
    assert snapshot.block(tail).state == "free"
    assert all(snapshot.block(b).ref_count == 0 for b in [*full, tail])


def test_a_preempted_request_waits_with_no_blocks():
    s = make(num_blocks=6, budget=64)  # 5 usable blocks: the newest must yield
    a, b = req("a", 2 * BLOCK_SIZE - 1), req("b", 2 * BLOCK_SIZE - 1, start=1000)
    s.add(a)
    s.add(b)
    for _ in range(3):
        run_step(s)
    assert b.status is Status.WAITING and b.num_preemptions == 1
    snapshot = take_snapshot(s)
    check_against_pool(snapshot, s.kv.allocator)
    print("requests:", [(r.request_id, r.status, r.num_preemptions, r.block_table)
                        for r in snapshot.requests])
    view = snapshot.request("b")
    assert view.status == "waiting" and view.num_preemptions == 1
    assert view.block_table == () and view.num_computed_tokens == 0
    assert [r.request_id for r in snapshot.requests] == ["a", "b"]  # running, then waiting
    # b's two full blocks were released into the cache, findable for its return.
    assert len(snapshot.cached_free) == 2


def test_snapshots_are_taken_only_while_watched_and_at_most_every_interval():
    s = make(num_blocks=20, budget=64)
    woken = []
    board = SnapshotBoard(min_interval=0.2, wake=lambda: woken.append(1))
    board.maybe_snapshot(s)
    assert board.latest is None, "nobody watches: no snapshot"
    board.want()
    assert woken == [1]
    board.maybe_snapshot(s)
    first = board.latest
    assert first is not None and first.seq == 0
    s.add(req("a", 5))
    run_step(s)
    board.record_step(StepRecord(1, time.monotonic(), 5, 0, 1.0, 1, 0, 0))
    board.maybe_snapshot(s)  # after a step, within min_interval: skipped
    assert board.latest is first
    board.maybe_snapshot(s, idle=True)  # the engine went idle: its last state is shown
    assert board.latest.seq == 1 and board.latest.request("a") is not None
    assert [r.prefill_tokens for r in board.latest.steps] == [5]
    board.maybe_snapshot(s, idle=True)  # nothing changed since
    assert board.latest.seq == 1
    time.sleep(0.25)
    run_step(s)
    board.record_step(StepRecord(2, time.monotonic(), 0, 1, 1.0, 1, 0, 0))
    board.maybe_snapshot(s)  # past min_interval: taken
    assert board.latest.seq == 2 and board.latest.step == 2
    assert board.latest.request("a").num_output_tokens == 2


def test_sliding_window_groups_show_every_group_and_what_a_window_gave_back():
    from api.dashboard.feed import snapshot_frame
    from tests.engine.test_scheduler import make_sliding

    s = make_sliding(num_blocks=40, window=20, budget=32)
    a = req("a", 70)
    s.add(a)
    for _ in range(3):  # the prompt in chunks of 32, 32 and 6
        run_step(s)
    snapshot = take_snapshot(s)
    check_against_pool(snapshot, s.kv.allocator)
    view = snapshot.request("a")
    held = [b for table in a.blocks.tables for b in table if b != 0]
    print("tables:", view.block_tables, "given back:", view.num_left_behind)
    assert len(view.block_tables) == 3 and snapshot.group_windows == (None, 20, 20)
    # 70 tokens computed: the next query, at 70, sees 51..70, so blocks 0-2 of each sliding
    # group are given back; the full-attention group keeps its 5.
    assert view.num_left_behind == 2 * 3 and sorted(view.held()) == sorted(held)
    assert len(held) == 5 + 2 * 2
    sliding_block = a.blocks.tables[2][3]
    assert snapshot.block(sliding_block).group == 2
    assert snapshot.block(sliding_block).position == 3
    frame = snapshot_frame(snapshot)
    [row] = frame["requests"]
    assert row["blocks"] == 9 and row["left_behind"] == 6 and frame["group_size"] == 1
