"""The embedding model's engine core (engine/embedding_core.py): whole inputs packed under
the step's token budget and seats, a longer input in a step of its own, each done in the
step that computes it; and its engine end to end, with the vector on the last output."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.embedding_core import EmbeddingEngineCore
from engine.request import FinishReason, Request, RequestOutput, SamplingParams
from model.gguf.source import load_tokenizer
from model.loader import load_model
from tests.families import save_embedding_model

EMBED = SamplingParams(max_tokens=0, temperature=0.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, model_dir):
    return save_embedding_model(tmp_path_factory.mktemp("embedding") / "tiny", model_dir)


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder)


def request(name: str, length: int, outputs: dict[str, RequestOutput],
            params: SamplingParams = EMBED, priority: int = 0) -> Request:
    ids = [(7 * i + len(name)) % 500 + 10 for i in range(length)]
    return Request(name, ids, params, lambda out: outputs.__setitem__(out.request_id, out),
                   priority=priority)


def core_for(model, **config) -> EmbeddingEngineCore:
    return EmbeddingEngineCore(EngineConfig(**config), model, [])


def test_a_step_packs_inputs_under_its_budget_and_a_long_one_goes_alone(model):
    core = core_for(model, max_num_batched_tokens=64)
    outputs: dict[str, RequestOutput] = {}
    for name, length in [("a", 10), ("b", 20), ("c", 30), ("d", 15), ("long", 100), ("e", 5)]:
        core.add(request(name, length, outputs))
    steps = []
    while core.has_work():
        result = core.step()
        steps.append([u.request.request_id for u in result.updates])
        assert result.embedded_inputs == len(steps[-1])
        assert result.num_prompt_tokens == sum(u.request.num_prompt_tokens
                                               for u in result.updates)
        assert all(u.finish_reason is FinishReason.STOP and len(u.embedding) == 48
                   for u in result.updates)
    assert steps == [["a", "b", "c"], ["d"], ["long"], ["e"]]
    assert core.stats()["waiting"] == 0 and core.stats()["blocks_total"] == 0


def test_seats_bound_a_step_and_priority_orders_the_line(model):
    core = core_for(model, max_num_seqs=2, scheduling_policy="priority")
    outputs: dict[str, RequestOutput] = {}
    for name, priority in [("late", 5), ("first", -1), ("second", 0)]:
        core.add(request(name, 4, outputs, priority=priority))
    assert [r.request_id for r in core.schedule()] == ["first", "second"]
    assert [r.request_id for r in core.schedule()] == ["late"]


def test_a_waiting_input_ended_from_outside_leaves_the_line(model):
    core = core_for(model)
    outputs: dict[str, RequestOutput] = {}
    gone = request("gone", 6, outputs)
    core.add(gone)
    core.add(request("kept", 6, outputs))
    assert core.num_waiting_tokens() == 12
    core.finish(gone, FinishReason.ABORT)
    assert [u.request.request_id for u in core.step().updates] == ["kept"]


def test_a_request_to_generate_fails_rather_than_being_embedded(model):
    core = core_for(model)
    result_of = {}
    core.add(request("gen", 4, result_of, params=SamplingParams(max_tokens=3)))
    result = core.step()
    assert [r.request_id for r in result.failed] == ["gen"]
    assert "generates no text" in result.error


def test_the_engine_hands_each_input_its_vector_once(model, folder):
    engine = BatchEngine(EngineConfig(max_num_batched_tokens=64), model, load_tokenizer(folder))
    assert engine.embedding_info is not None and engine.embedding_info.dimensions == 48
    outputs: dict[str, list[RequestOutput]] = {}
    done = threading.Event()
    lengths = {"x": 12, "y": 40, "z": 30}

    def collect(out: RequestOutput) -> None:
        outputs.setdefault(out.request_id, []).append(out)
        if sum(o.finished for v in outputs.values() for o in v) == len(lengths):
            done.set()

    engine.start()
    try:
        for name, length in lengths.items():
            ids = [(3 * i + length) % 500 + 10 for i in range(length)]
            engine.add_request(Request(name, ids, EMBED, collect))
        assert done.wait(60)
        metrics = engine.metrics.render().decode()
    finally:
        engine.shutdown()
    for name, length in lengths.items():
        [out] = outputs[name]
        assert out.finished and out.finish_reason is FinishReason.STOP and out.error is None
        assert out.num_prompt_tokens == length and out.token_ids == []
        ids = [(3 * i + length) % 500 + 10 for i in range(length)]
        torch.testing.assert_close(torch.tensor(out.embedding), model.embed([ids])[0],
                                   atol=1e-5, rtol=1e-4)
    assert "nano_vllm:embedding_inputs_total 3.0" in metrics
    assert f"nano_vllm:embedding_tokens_total {float(sum(lengths.values()))}" in metrics
