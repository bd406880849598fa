"""Several samples of one prompt (n, best_of): prefilled once, blocks shared, the partial
block copied on first write; answers as if each sample ran alone."""

from __future__ import annotations

import pytest
import torch

from engine.request import FinishReason, Request, SamplingParams
from tests.conftest import PROMPTS
from tests.engine.test_logprobs import LONG, drive, engine_for


def hf_greedy_ids(hf_model, ids: list[int], num_tokens: int) -> list[int]:
    """Hugging Face's argmax, token by token, carrying on past end-of-sequence."""
    sequence = list(ids)
    with torch.no_grad():
        for _ in range(num_tokens):
            sequence.append(int(hf_model(torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(ids):]


def tokens_of(outputs) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


@pytest.mark.parametrize("text", [LONG, "word " * 31], ids=["partial-last-block", "full-blocks"])
def test_greedy_samples_are_equal_and_equal_hf(model, tokenizer, hf_model, text):
    engine = engine_for(model, tokenizer)
    ids = tokenizer(text).input_ids
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, n=3)
    by_sample = drive(engine, [Request("g", ids, params, print)])
    answers = [tokens_of(by_sample[i]) for i in range(3)]
    expected = hf_greedy_ids(hf_model, ids, 8)
    print(f"{len(ids)} prompt tokens; samples {answers}; HF {expected}")
    assert answers == [expected] * 3
    assert engine.core.allocator.num_used == 0
    engine.core.allocator.check_invariants()


def test_seeded_samples_are_reproducible_and_seeded_by_index(model, tokenizer):
    engine = engine_for(model, tokenizer)
    ids = tokenizer(PROMPTS[1]).input_ids

    def sampled(seed: int, n: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, seed=seed, n=n)
        by_sample = drive(engine, [Request(f"s{seed}-{n}", ids, params, print)])
        return [tokens_of(by_sample[i]) for i in range(n)]

    first, second, alone = sampled(10, 3), sampled(10, 3), sampled(11, 1)
    print("n=3 seed 10:", first, "\nagain:", second, "\nseed 11 alone:", alone)
    assert first == second
    assert first[1] == alone[0]  # sample i is seeded with seed + i
    assert len({tuple(t) for t in first}) > 1


def test_aborting_one_request_ends_all_its_samples_and_frees_every_block(model, tokenizer):
    engine = engine_for(model, tokenizer)
    outputs = []
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True, n=4)
    engine.add_request(Request("doomed", tokenizer(LONG).input_ids, params, outputs.append))
    for _ in range(3):
        engine.step()
    used = engine.core.allocator.num_used
    print(f"after 3 steps: {engine.stats()}")
    assert engine.stats()["running"] == 4 and used > 0
    engine.abort("doomed")
    engine.step()
    ends = sorted((o.sample_index, o.finish_reason) for o in outputs if o.finished)
    print("ends:", ends, engine.stats())
    assert ends == [(i, FinishReason.ABORT) for i in range(4)]
    assert engine.core.allocator.num_used == 0 and engine.stats()["running"] == 0
    engine.core.allocator.check_invariants()
