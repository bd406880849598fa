"""A step's plan and output, keyed by request id."""

from __future__ import annotations

import pytest

from engine.request import Request, SamplingParams
from engine.step_types import RunnerOutput, SchedulerOutput


def req(rid: str, n: int) -> Request:
    return Request(rid, list(range(100, 100 + n)), SamplingParams(temperature=0),
                   on_output=lambda out: None)


def test_the_plan_is_keyed_by_id_in_batch_order_and_takes_each_request_once():
    plan = SchedulerOutput()
    a, b = req("a", 10), req("b", 4)
    a.num_computed_tokens = 6
    plan.add(a, 4)
    plan.add(b, 3)
    with pytest.raises(ValueError, match="already in this step"):
        plan.add(a, 1)
    assert plan.plan() == [("a", 4), ("b", 3)]
    assert plan.requests() == [a, b]
    assert plan.scheduled["a"].reaches_end and not plan.scheduled["b"].reaches_end
    assert plan.scheduled["a"].token_ids() == a.token_ids[6:]
    assert plan.num_tokens == 7 and plan.num_prompt_tokens == 7


def test_drafts_follow_the_last_token_and_do_not_count_towards_the_end():
    plan = SchedulerOutput()
    r = req("r", 8)
    r.num_computed_tokens = 7  # decoding: one token left to compute
    entry = plan.add(r, 3, [5, 6])
    assert entry.token_ids() == [r.token_ids[-1], 5, 6]
    assert entry.reaches_end and [e.request_id for e in plan.drafting()] == ["r"]


def test_a_fork_names_the_request_it_samples_from():
    plan = SchedulerOutput()
    head = req("h", 4)
    sample = head.fork(1)
    plan.add(head, 4)
    sample.num_computed_tokens = sample.num_tokens
    plan.add(sample, 0, fork_of="h")
    assert plan.scheduled["h#1"].fork_of == "h" and plan.scheduled["h#1"].reaches_end
    assert plan.scheduled["h#1"].token_ids() == []


def test_runner_output_has_nothing_for_a_request_it_does_not_name():
    output = RunnerOutput({"a": [7]})
    assert output.tokens("a") == [7] and output.tokens("b") == []
