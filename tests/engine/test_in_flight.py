"""Samples of one prompt tracked apiece, their group until the last has finished."""

from __future__ import annotations

from engine.in_flight import InFlight
from engine.request import Request, SamplingParams


def test_a_request_fans_out_into_its_samples_and_its_group_outlives_the_first():
    tracked = InFlight()
    head = Request("r", [1, 2, 3], SamplingParams(n=3), on_output=lambda out: None)
    group = tracked.take(head)
    assert [s.request_id for s in group] == ["r", "r#1", "r#2"]
    assert head.pending_forks == group[1:] and len(tracked) == 3
    tracked.forget(head)
    assert "r" not in tracked and tracked.group("r") == group  # r#1, r#2 still run
    for sample in group[1:]:
        tracked.forget(sample)
    assert len(tracked) == 0 and tracked.group("r") == []
