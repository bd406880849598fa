"""The waiting line's order: priority (lower first), aging so nothing starves, and the
scheduler seating by it (toy pool, no model)."""

from __future__ import annotations

from engine.request import Request, SamplingParams
from engine.scheduler import Scheduler
from engine.waiting_queue import PriorityQueue
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager
from tests.engine.test_scheduler import EOS, run_step


def req(rid: str, priority: int, arrival: float, n: int = 8) -> Request:
    return Request(rid, list(range(100, 100 + n)), SamplingParams(temperature=0, max_tokens=2),
                   on_output=lambda out: None, arrival_time=arrival, priority=priority)


def drain(queue: PriorityQueue) -> list[str]:
    order = []
    while queue:
        order.append(queue.popleft().request_id)
    return order


def test_lower_priority_first_then_arrival():
    q = PriorityQueue(aging=0)
    for rid, priority, arrival in [("a", 5, 1.0), ("b", 0, 2.0), ("c", -3, 3.0), ("d", 0, 0.5)]:
        q.append(req(rid, priority, arrival))
    assert q[0].request_id == "c"
    order = drain(q)
    print(order)
    assert order == ["c", "d", "b", "a"]


def test_remove_and_contains_keep_the_order():
    q = PriorityQueue(aging=0)
    requests = [req(str(i), priority=i % 3, arrival=float(i)) for i in range(9)]
    for r in requests:
        q.append(r)
    q.remove(requests[3])  # priority 0, arrival 3
    assert requests[3] not in q and requests[4] in q and len(q) == 8
    assert drain(q) == ["0", "6", "1", "4", "7", "2", "5", "8"]


def test_aging_a_long_wait_beats_a_better_priority():
    """aging=10 s: a priority-3 request that has waited 40 s more goes before a fresh
    priority-0 one; one that has waited only 20 s more does not."""
    q = PriorityQueue(aging=10)
    q.append(req("old-low", 3, arrival=0.0))
    q.append(req("fresh-high", 0, arrival=40.0))
    q.append(req("recent-high", 0, arrival=20.0))
    order = drain(q)
    print(order)
    assert order == ["recent-high", "old-low", "fresh-high"]


def test_no_starvation_under_a_steady_stream_of_better_requests():
    """One seat; a priority-10 request waits while a priority-0 request arrives every
    second. With aging (1 s per level) it is seated once it has waited ~10 s; without
    aging it never is."""
    for aging, expect_seated in ((1.0, True), (0.0, False)):
        s = Scheduler(KVCacheManager(BlockAllocator(64)), 1, 64, eos_token_ids=[EOS],
                      scheduling_policy="priority", priority_aging=aging)
        low = req("low", 10, arrival=0.0)
        s.add(low)
        seated_at = None
        for t in range(1, 40):
            s.add(req(f"high-{t}", 0, arrival=float(t)))
            # Each request needs two steps (prefill + one token, max_tokens=2).
            steps = [run_step(s) for _ in range(2)]
            if any(rid == "low" for step in steps for rid, _ in step):
                seated_at = t
                break
        print(f"aging={aging}: low seated at t={seated_at}")
        assert (seated_at is not None) == expect_seated
        if expect_seated:
            assert seated_at is not None and 9 <= seated_at <= 12


def test_fcfs_ignores_nothing_it_is_given():
    """fcfs keeps arrival order (priority is refused by the API under fcfs)."""
    s = Scheduler(KVCacheManager(BlockAllocator(64)), 1, 64, eos_token_ids=[EOS])
    for rid, priority, arrival in [("a", 5, 1.0), ("b", 0, 2.0)]:
        s.add(req(rid, priority, arrival))
    assert run_step(s)[0][0] == "a"


def test_priority_scheduler_seats_the_best_first_and_preempted_keep_their_place():
    s = Scheduler(KVCacheManager(BlockAllocator(64)), 1, 64, eos_token_ids=[EOS],
                  scheduling_policy="priority", priority_aging=0)
    for rid, priority, arrival in [("late-best", -1, 3.0), ("first", 2, 1.0), ("mid", 0, 2.0)]:
        s.add(req(rid, priority, arrival))
    seated = []
    while s.has_work():
        for rid, _ in run_step(s):
            if rid not in seated:
                seated.append(rid)
    print(seated)
    assert seated == ["late-best", "mid", "first"]
    # A preempted request returns by its own key, ahead of a later one of its priority.
    a, b = req("a", 0, 1.0), req("b", 0, 2.0)
    s.add(b)
    s.add(a)
    run_step(s)
    assert s.running == [a]
    s.preempt(a)
    assert s.waiting[0] is a
