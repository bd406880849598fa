"""The engine's greedy answers against Hugging Face `generate`, token for token."""

from __future__ import annotations

import pytest
import torch

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.engine_loop import EngineLoop
from engine.request import FinishReason, Request, RequestOutput, SamplingParams
from kvcache.pool import BLOCK_SIZE

MAX_NEW = 12

QUESTIONS = [
    "The cat sat on the",
    "Paris is the capital of",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "Once upon a time, in a small village by the mountains, there lived an old",
    "The quick brown fox",
    "def add(a, b):\n    return",
    "Water boils at a temperature of",
    "My favourite colour is blue because",
    "In the year 2050, cities will",
]
# A shared ~40-token system prompt, so that some requests hit the prefix cache.
SYSTEM = ("You are a careful assistant. Answer briefly and truthfully, using plain words. "
          "If you do not know, say so. Never invent facts or sources. ")


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    texts = [SYSTEM + q if i % 2 else q for i, q in enumerate(QUESTIONS)]
    return [tokenizer(t).input_ids for t in texts]


@pytest.fixture(scope="session")
def hf_answers(hf_model, prompts) -> list[list[int]]:
    """Greedy continuations from transformers' generate, one prompt at a time."""
    answers = []
    for ids in prompts:
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        answers.append(out[0, len(ids):].tolist())
    return answers


def run(engine: BatchEngine, prompts: list[list[int]], arrive_at: list[int],
        max_tokens: int = MAX_NEW, ignore_eos: bool = False,
        priorities: list[int] | None = None) -> tuple[list[list[int]], list[Request]]:
    """Drive the engine step by step; request i joins before step arrive_at[i]."""
    outputs: dict[int, list[RequestOutput]] = {i: [] for i in range(len(prompts))}
    requests = [Request(str(i), ids, SamplingParams(max_tokens=max_tokens, temperature=0,
                                                    ignore_eos=ignore_eos),
                        on_output=outputs[i].append,
                        priority=priorities[i] if priorities else 0)
                for i, ids in enumerate(prompts)]
    step = 0
    while not all(outs and outs[-1].finished for outs in outputs.values()):
        for i, r in enumerate(requests):
            if arrive_at[i] == step:
                engine.add_request(r)
        engine.step()
        step += 1
        assert step < 2000, "engine made no progress"
    tokens = [[t for o in outputs[i] for t in o.token_ids] for i in range(len(prompts))]
    for outs in outputs.values():
        assert outs[-1].error is None, outs[-1].error
    return tokens, requests


def record_step_tokens(engine: BatchEngine) -> list[int]:
    """A list that gets each step's scheduled token count, as the engine runs."""
    counts: list[int] = []
    schedule = engine.core.scheduler.schedule

    def recording_schedule():
        step = schedule()
        counts.append(step.num_tokens)
        return step

    engine.core.scheduler.schedule = recording_schedule
    return counts


def make_engine(model, tokenizer, **overrides) -> BatchEngine:
    return BatchEngine(EngineConfig(**{"num_blocks": 128, **overrides}), model, tokenizer)


def check(tokens: list[list[int]], hf_answers: list[list[int]], label: str) -> None:
    for i, (ours, theirs) in enumerate(zip(tokens, hf_answers)):
        print(f"{label} request {i}: ours {ours}\n{' ' * len(label)}            hf {theirs}")
        assert ours == theirs, f"request {i} differs from Hugging Face generate"


def test_one_user_alone_matches_hf(model, tokenizer, prompts, hf_answers):
    engine = make_engine(model, tokenizer)
    tokens, _ = run(engine, prompts[:1], [0])
    check(tokens, hf_answers[:1], "alone")


@pytest.mark.parametrize("prefix_cache", [True, False], ids=["prefix-cache-on", "prefix-cache-off"])
def test_ten_users_arriving_mid_decode_match_hf(model, tokenizer, prompts, hf_answers,
                                                 prefix_cache):
    engine = make_engine(model, tokenizer, enable_prefix_cache=prefix_cache)
    arrive_at = [0, 0, 1, 3, 3, 4, 6, 9, 10, 14]  # later ones join while others decode
    tokens, requests = run(engine, prompts, arrive_at)
    check(tokens, hf_answers, "batched")
    hits = sum(r.num_cached_tokens for r in requests)
    print(f"prefix cache {'on' if prefix_cache else 'off'}: {hits} prompt tokens reused")
    assert (hits > 0) == prefix_cache
    # The system prompt ends inside a block: later users copy that block's first tokens.
    assert any(r.num_cached_tokens % BLOCK_SIZE for r in requests) == prefix_cache
    assert engine.core.allocator.num_used == 0  # everything released


def test_chunked_prefill_under_a_small_budget_matches_hf(model, tokenizer, prompts, hf_answers):
    engine = make_engine(model, tokenizer, max_num_seqs=4, max_num_batched_tokens=16)
    budgets = record_step_tokens(engine)
    tokens, _ = run(engine, prompts, [0] * len(prompts))
    check(tokens, hf_answers, "chunked")
    print(f"{len(budgets)} steps, most tokens in one step: {max(budgets)} (budget 16)")
    assert max(budgets) <= 16


def test_preemption_under_a_tiny_pool_gives_the_same_answers(model, tokenizer, prompts):
    alone = make_engine(model, tokenizer)
    expected = [run(alone, [ids], [0], max_tokens=24, ignore_eos=True)[0][0]
                for ids in prompts[:6]]
    # 12 blocks (11 usable, 176 tokens) for 6 users needing ~3 blocks each: someone must yield.
    tiny = make_engine(model, tokenizer, num_blocks=12, max_num_seqs=6)
    tokens, requests = run(tiny, prompts[:6], [0] * 6, max_tokens=24, ignore_eos=True)
    preemptions = sum(r.num_preemptions for r in requests)
    print(f"tiny pool: {preemptions} preemptions")
    assert preemptions > 0
    for i, (ours, theirs) in enumerate(zip(tokens, expected)):
        assert len(ours) == 24, f"request {i}: {len(ours)} tokens, duplicated or lost"
        assert ours == theirs, f"request {i} changed under preemption"
    assert tiny.core.allocator.num_used == 0
    tiny.core.allocator.check_invariants()


def test_priority_preemption_spares_the_best_and_changes_no_answer(model, tokenizer, prompts):
    """Under --scheduling-policy priority the tiny pool preempts the low priorities: the
    worst arrive (and are seated) first, yet the best two, seated last, are never
    preempted, and every answer is still the one each request gets alone."""
    alone = make_engine(model, tokenizer)
    expected = [run(alone, [ids], [0], max_tokens=24, ignore_eos=True)[0][0]
                for ids in prompts[:6]]
    tiny = make_engine(model, tokenizer, num_blocks=12, max_num_seqs=6,
                       scheduling_policy="priority")
    tokens, requests = run(tiny, prompts[:6], [0, 0, 1, 1, 2, 2], max_tokens=24,
                           ignore_eos=True, priorities=[5, 4, 3, 2, 1, 0])
    preempted = {r.priority: r.num_preemptions for r in requests}
    print("preemptions by priority:", preempted)
    assert sum(preempted.values()) > 0 and preempted[0] == preempted[1] == 0
    assert tokens == expected
    assert tiny.core.allocator.num_used == 0
    tiny.core.allocator.check_invariants()


def test_a_failing_step_fails_only_its_requests(model, tokenizer, prompts):
    engine = make_engine(model, tokenizer)
    real_execute = engine.core.runner.execute
    calls = {"n": 0}

    def flaky(scheduled):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure")
        return real_execute(scheduled)

    engine.core.runner.execute = flaky
    outs: list[RequestOutput] = []
    engine.add_request(Request("doomed", prompts[0], SamplingParams(max_tokens=5, temperature=0),
                               on_output=outs.append))
    engine.step()  # prefill succeeds
    engine.step()  # decode fails
    assert outs[-1].finished and outs[-1].finish_reason == "error"
    assert "injected failure" in outs[-1].error
    assert engine.core.allocator.num_used == 0
    tokens, _ = run(engine, prompts[:2], [0, 0], max_tokens=4)  # and it keeps serving
    assert all(len(t) == 4 for t in tokens)


def test_without_text_a_stop_string_found_elsewhere_ends_one_sample_once(model, tokenizer,
                                                                         prompts):
    """An engine loop (as in the engine core process, and under the thread front): outputs carry
    token ids and timing, no text; end_sample ends one sample of two (reason stop, its seat
    freed), and for a sample that has ended already it does nothing. Finished requests are
    counted by whoever makes the text, not here."""
    engine = EngineLoop(EngineConfig(num_blocks=128), model, tokenizer)
    outputs: list[RequestOutput] = []
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=1, n=2, ignore_eos=True)
    engine.add(Request("r", prompts[0], params, on_output=outputs.append))

    def of(index: int) -> list[RequestOutput]:
        return [o for o in outputs if o.sample_index == index]

    while sum(len(o.token_ids) for o in of(1)) < 3:
        engine.step()
    engine.end_sample("r#1")
    engine.step()
    assert [o.finish_reason for o in of(1) if o.finished] == [FinishReason.STOP]
    assert engine.core.stats()["running"] == 1
    while not of(0)[-1].finished:
        engine.step()
    engine.end_sample("r")  # ended by length already
    engine.end_sample("r#1")  # ended here already
    while engine.has_work():
        engine.step()
    print([(o.sample_index, o.token_ids, o.finish_reason) for o in outputs if o.finished])
    assert [o.finish_reason for o in outputs if o.finished] == [FinishReason.STOP,
                                                                  FinishReason.LENGTH]
    assert all(o.text == "" and o.timing is not None for o in outputs)
    assert engine.core.allocator.num_used == 0
    assert b"request_success" not in engine.metrics.render()
