"""The drain rate behind a 429's Retry-After (engine/admission.py), on made-up clocks."""

from __future__ import annotations

import pytest

from engine.admission import (
    DEFAULT_RETRY_AFTER,
    MAX_RETRY_AFTER,
    DrainRate,
    LineSize,
    retry_seconds,
)


def test_nothing_measured_gives_the_default():
    rate = DrainRate()
    assert rate.requests_per_second is None
    assert rate.retry_after(excess_requests=5) == DEFAULT_RETRY_AFTER


def test_rate_is_what_left_the_line_per_busy_second():
    """10 requests (100 tokens each) wait; 2 leave per second and none join: 2 req/s,
    200 tokens/s. Idle time afterwards (empty line) does not dilute it."""
    rate = DrainRate(window=1000)  # decay negligible over these few seconds
    rate.observe(0.0, LineSize(10, 1000), LineSize())
    for t in range(1, 6):
        rate.observe(float(t), LineSize(10 - 2 * t, 1000 - 200 * t), LineSize())
    for t in range(6, 60):  # empty line: not counted
        rate.observe(float(t), LineSize(), LineSize())
    print(f"{rate.requests_per_second} req/s, {rate.tokens_per_second} tokens/s")
    assert rate.requests_per_second == pytest.approx(2.0)
    assert rate.tokens_per_second == pytest.approx(200.0)
    assert rate.retry_after(excess_requests=7) == 4  # 3.5 s, rounded up
    assert rate.retry_after(excess_tokens=450) == 3
    assert rate.retry_after(excess_requests=1, excess_tokens=1000) == 5  # the longer wait
    assert rate.retry_after(excess_requests=1) == 1  # at least a second
    assert rate.retry_after(excess_requests=10_000) == MAX_RETRY_AFTER


def test_arrivals_count_towards_what_drained():
    """The line stays at 4 while 3 join each second: 3 left each second."""
    rate = DrainRate(window=1000)
    rate.observe(0.0, LineSize(4, 40), LineSize())
    for t in range(1, 4):
        rate.observe(float(t), LineSize(4, 40), LineSize(3, 30))
    assert rate.requests_per_second == pytest.approx(3.0)
    assert rate.tokens_per_second == pytest.approx(30.0)


def test_a_stuck_line_asks_for_the_longest_wait_and_old_rates_fade():
    rate = DrainRate(window=10)
    rate.observe(0.0, LineSize(10, 100), LineSize())
    rate.observe(1.0, LineSize(5, 50), LineSize())  # 5 req/s for a second
    fast = rate.requests_per_second
    for t in range(2, 60):  # then nothing moves for a long while
        rate.observe(float(t), LineSize(5, 50), LineSize())
    print(f"rate then {fast}, after a stuck minute {rate.requests_per_second:.4f}")
    assert fast == pytest.approx(5.0)
    assert rate.requests_per_second is not None and rate.requests_per_second < 0.05
    assert rate.retry_after(excess_requests=1) > 20


def test_check_line_counts_what_free_seats_do_not_absorb():
    """check_line, as BatchEngine and the engine-process client both run it: 2 seats free of
    4 take the first two requests of the inbox; the rest count as waiting, by number and by
    prompt tokens; a request alone in the line is never refused for its length."""
    from engine.admission import QueueFullError, check_line
    from engine.config import EngineConfig

    config = EngineConfig(max_num_seqs=4, max_waiting=2, max_num_queued_tokens=100)
    seen: list[dict] = []

    def retry(**excess: int) -> int:
        seen.append(excess)
        return 3

    check_line(config, 10, running=2, waiting=0, inbox_tokens=[40, 40, 30], line_tokens=0,
               retry_after=retry)  # 1 waits (30 tokens) + 10 <= 100
    with pytest.raises(QueueFullError) as refused:
        check_line(config, 10, running=2, waiting=1, inbox_tokens=[40, 40, 30],
                   line_tokens=20, retry_after=retry)  # 2 wait: the line is full
    assert refused.value.retry_after == 3 and seen[-1] == {"excess_requests": 1}
    with pytest.raises(QueueFullError):
        check_line(config, 60, running=4, waiting=0, inbox_tokens=[50], line_tokens=0,
                   retry_after=retry)  # 50 + 60 tokens > 100
    assert seen[-1] == {"excess_tokens": 10}
    check_line(config, 500, running=4, waiting=0, inbox_tokens=[], line_tokens=0,
               retry_after=retry)  # alone: admitted however long


def test_the_line_tracker_counts_what_joined_until_a_step_ends():
    from engine.admission import LineTracker, QueueFullError
    from engine.config import EngineConfig

    config = EngineConfig(max_num_seqs=1, max_waiting=100, max_num_queued_tokens=100)
    tracker = LineTracker()
    tracker.joined([60, 30])
    with pytest.raises(QueueFullError):  # 90 joined since the last step, + 20 > 100
        tracker.check(config, 20, running=1, waiting=0, inbox_tokens=[])
    assert tracker.step_ended(LineSize(1, 10)) == LineSize(2, 90)
    tracker.check(config, 20, running=1, waiting=1, inbox_tokens=[])  # 10 + 20 fit


def test_a_line_nothing_has_left_asks_for_the_longest_wait():
    """A rate measured as 0 (a line that has only waited so far) makes the wait infinite:
    the answer is the cap, not an error (which would turn the 429 into a 500)."""
    rate = DrainRate(window=10)
    for t in range(3):
        rate.observe(float(t), LineSize(4, 400), LineSize())
    print("rates", rate.requests_per_second, rate.tokens_per_second)
    assert rate.requests_per_second == 0
    assert rate.retry_after(excess_requests=1) == MAX_RETRY_AFTER
    assert rate.retry_after(excess_tokens=100) == MAX_RETRY_AFTER
    assert retry_seconds(0.0, 0.0, 1, 0) == retry_seconds(0.0, None, 1, 0) == MAX_RETRY_AFTER
