"""Logprobs of sampled and prompt tokens against Hugging Face's log_softmax of its own logits,
with chunked prefill and with a prefix that sits in the prefix cache."""

from __future__ import annotations

import pytest
import torch

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.request import FinishReason, Request, RequestOutput, SamplingParams
from tests.conftest import LOGITS_ATOL, PROMPTS

# 38 tokens: more than two blocks, so a second request can hit the prefix cache.
LONG = PROMPTS[2] + " taught engineering, flew again and spoke about the flight for years."


def drive(engine: BatchEngine, requests: list[Request]) -> dict[int, list[RequestOutput]]:
    """Step until every sample of every request has finished; outputs by sample index (for
    one request) or by request order (samples 0 only)."""
    outputs: list[RequestOutput] = []
    for r in requests:
        r.on_output = outputs.append
        engine.add_request(r)
    expected = sum(r.params.n for r in requests)
    for _ in range(500):
        if sum(o.finished for o in outputs) == expected:
            break
        engine.step()
    by_sample: dict[int, list[RequestOutput]] = {}
    for o in outputs:
        assert o.error is None, o.error
        key = o.sample_index if len(requests) == 1 else next(
            i for i, r in enumerate(requests) if r.request_id == o.request_id)
        by_sample.setdefault(key, []).append(o)
    return by_sample


def hf_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """Row j: Hugging Face's log_softmax over the token after position j."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([token_ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def check_against_hf(entries, hf: torch.Tensor, targets: list[int], label: str) -> None:
    """entries[k] scores targets[k] from hf row k: its value and its top list."""
    worst = 0.0
    for k, entry in enumerate(entries):
        assert entry.token_id == targets[k]
        worst = max(worst, abs(entry.logprob - hf[k, targets[k]].item()))
        theirs = hf[k].topk(len(entry.top)).values.tolist()
        worst = max([worst, *(abs(a - b) for (_, a), b in zip(entry.top, theirs, strict=True))])
        for token, value in entry.top:  # the ids too, unless two are within the tolerance
            worst = max(worst, abs(value - hf[k, token].item()))
    print(f"{label}: {len(entries)} positions, max |ours - HF| = {worst:.2e}")
    assert worst <= LOGITS_ATOL


def engine_for(model, tokenizer, **overrides) -> BatchEngine:
    return BatchEngine(EngineConfig(**{"num_blocks": 64, **overrides}), model, tokenizer)


@pytest.mark.parametrize("budget", [512, 16], ids=["one-step-prefill", "chunked-prefill"])
def test_sampled_and_prompt_logprobs_equal_hf(model, tokenizer, hf_model, budget):
    engine = engine_for(model, tokenizer, max_num_batched_tokens=budget)
    ids = tokenizer(LONG).input_ids
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=4,
                            prompt_logprobs=3)
    [outs] = drive(engine, [Request("r", ids, params, print)]).values()
    generated = [t for o in outs for t in o.token_ids]
    sampled = [lp for o in outs for lp in o.logprobs]
    prompt = next(o.prompt_logprobs for o in outs if o.prompt_logprobs)
    hf = hf_logprobs(hf_model, ids + generated)
    assert prompt[0] is None and len(prompt) == len(ids)
    assert all(len(e.top) == 3 for e in prompt[1:]) and all(len(e.top) == 4 for e in sampled)
    check_against_hf(prompt[1:], hf, ids[1:], "prompt")
    check_against_hf(sampled, hf[len(ids) - 1:], generated, "sampled")
    assert abs(outs[-1].cumulative_logprob - sum(e.logprob for e in sampled)) < 1e-4
    assert engine.core.allocator.num_used == 0


def test_prompt_logprobs_skip_the_prefix_cache(model, tokenizer, hf_model):
    """A prompt whose blocks are cached is still scored from its first token: its cached
    blocks have no logits, so the request computes them again (and says so)."""
    engine = engine_for(model, tokenizer)
    ids = tokenizer(LONG).input_ids
    warm = drive(engine, [Request("warm", ids, SamplingParams(max_tokens=1, temperature=0),
                                  print)])
    again = drive(engine, [Request("again", ids, SamplingParams(max_tokens=1, temperature=0),
                                   print)])
    print("cached tokens without prompt logprobs:", again[0][-1].num_cached_tokens)
    assert warm[0][-1].num_cached_tokens == 0 and again[0][-1].num_cached_tokens == 32

    scored = drive(engine, [Request("scored", ids, SamplingParams(
        max_tokens=0, temperature=0, prompt_logprobs=1), print)])
    [last] = scored[0]
    print("max_tokens 0:", last.finish_reason, last.token_ids, last.timing)
    assert last.finished and last.finish_reason is FinishReason.LENGTH and last.token_ids == []
    assert last.num_cached_tokens == 0 and last.num_output_tokens == 0
    assert last.timing is not None and last.timing.prompt_tokens_computed == len(ids)
    check_against_hf(last.prompt_logprobs[1:], hf_logprobs(hf_model, ids), ids[1:], "cached")
    assert engine.core.allocator.num_used == 0


def test_processed_logprobs_are_of_the_distribution_sampled_from(model, tokenizer, hf_model):
    engine = engine_for(model, tokenizer)
    ids = tokenizer(PROMPTS[0]).input_ids
    params = SamplingParams(max_tokens=3, temperature=0.5, top_k=3, seed=1, logprobs=5,
                            logprobs_mode="processed")
    [outs] = drive(engine, [Request("p", ids, params, print)]).values()
    generated = [t for o in outs for t in o.token_ids]
    entries = [lp for o in outs for lp in o.logprobs]
    hf = hf_logprobs(hf_model, ids + generated)[len(ids) - 1:]
    for k, entry in enumerate(entries):
        logits = hf[k] / 0.5  # log_softmax is shift-free: logprobs / T are logits / T + c
        kept = logits.topk(3)
        expected = torch.log_softmax(kept.values, dim=-1)
        print(f"token {generated[k]}: ours {entry.top}, expected {expected.tolist()}")
        assert generated[k] in kept.indices.tolist()
        assert [t for t, _ in entry.top[:3]] == kept.indices.tolist()
        assert torch.allclose(torch.tensor([v for _, v in entry.top[:3]]), expected,
                              atol=2 * LOGITS_ATOL / 0.5)
        assert all(v == float("-inf") for _, v in entry.top[3:])  # outside top-k
