"""Each logits processor against a reference computed row by row on the logits, and greedy
decoding with repetition_penalty against Hugging Face `generate`."""

from __future__ import annotations

import pytest
import torch

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.logits_processors import apply_logits_processors, apply_min_p
from engine.request import Request, RequestOutput, SamplingParams
from engine.sampler import Sampler

VOCAB = 50


def request(prompt: list[int], output: list[int], **params) -> Request:
    r = Request("r", prompt, SamplingParams(temperature=0, **params), on_output=lambda _: None)
    r.token_ids.extend(output)
    return r


def reference(logits: torch.Tensor, r: Request) -> torch.Tensor:
    """One row processed token by token, straight from the definitions."""
    p = r.params
    row = logits.double().clone()
    if p.allowed_token_ids is not None:
        for t in range(VOCAB):
            if t not in p.allowed_token_ids:
                row[t] = float("-inf")
    for t, bias in p.logit_bias.items():
        row[t] += bias
    output = r.token_ids[r.num_prompt_tokens:]
    for t in set(r.token_ids):
        row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t in set(output):
        row[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return row


CASES = [
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.7),
    dict(presence_penalty=0.8),
    dict(frequency_penalty=-0.5),
    dict(presence_penalty=1.0, frequency_penalty=0.6, repetition_penalty=1.2),
    dict(logit_bias={3: 5.0, 7: -100.0, 9: 2.5}),
    dict(allowed_token_ids=[1, 4, 9, 16]),
    dict(logit_bias={4: 3.0}, allowed_token_ids=[4, 5], frequency_penalty=1.5),
]


def test_processors_match_a_row_by_row_reference():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(CASES) + 1, VOCAB, generator=gen) * 4
    requests = []
    for params in CASES:
        prompt = torch.randint(0, VOCAB, (6,), generator=gen).tolist()
        output = torch.randint(0, VOCAB, (9,), generator=gen).tolist() + [prompt[0]] * 2
        requests.append(request(prompt, output, **params))
    requests.append(request([1, 2, 3], [3, 3]))  # no processor: its row is left alone
    got = apply_logits_processors(logits, requests)
    for i, r in enumerate(requests):
        want = reference(logits[i], r).float()
        diff = (got[i] - want).abs().nan_to_num(0).max().item()
        print(f"row {i} {CASES[i] if i < len(CASES) else 'none'}: max |diff| {diff:.2e}")
        assert torch.equal(got[i].isinf(), want.isinf())
        assert diff < 1e-5
    assert torch.equal(got[-1], logits[-1])
    assert not torch.equal(got[0], logits[0])


def test_no_processor_leaves_the_logits_as_they_are():
    logits = torch.randn(2, VOCAB)
    requests = [request([1], [2]), request([3], [])]
    assert apply_logits_processors(logits, requests) is logits


def test_min_p_matches_its_definition():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, VOCAB, generator=gen) * 3
    min_p = torch.tensor([0.0, 0.1, 0.5])
    got = apply_min_p(logits, min_p)
    probs = torch.softmax(logits, dim=-1)
    for i in range(3):
        kept = [t for t in range(VOCAB) if probs[i, t] >= min_p[i] * probs[i].max()]
        print(f"min_p {min_p[i].item()}: keeps {len(kept)} of {VOCAB}")
        assert got[i].isfinite().nonzero().flatten().tolist() == kept
    assert len(got[2].isfinite().nonzero()) < len(got[1].isfinite().nonzero()) < VOCAB


def test_sampling_with_min_p_never_draws_below_it():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0] + [-5.0] * (VOCAB - 4)] * 200)
    requests = []
    for i in range(200):
        r = Request(str(i), [1], SamplingParams(temperature=1.0, min_p=0.2, seed=i),
                    on_output=lambda _: None)
        requests.append(r)
    drawn = Sampler()(logits, requests)
    print("drawn:", sorted(set(drawn)))
    assert set(drawn) == {0, 1}  # p(1)/p(0) = e^-1 > 0.2; p(2)/p(0) = e^-4 < 0.2


def test_processed_logprobs_see_the_bias_and_raw_ones_do_not():
    logits = torch.zeros(2, VOCAB)
    mode = {"logprobs": 0}
    raw = Request("a", [1], SamplingParams(temperature=0, logit_bias={5: 10.0}, **mode),
                  on_output=lambda _: None)
    cooked = Request("b", [1], SamplingParams(temperature=0, logit_bias={5: 10.0},
                                              logprobs_mode="processed", **mode),
                     on_output=lambda _: None)
    out = Sampler().sample(logits, [raw, cooked])
    print("tokens", out.token_ids, "logprobs", [lp.logprob for lp in out.logprobs])
    assert out.token_ids == [5, 5]
    assert out.logprobs[0].logprob == pytest.approx(-torch.log(torch.tensor(VOCAB)).item())
    biased = torch.log_softmax(torch.tensor([10.0] + [0.0] * (VOCAB - 1)), dim=0)[0].item()
    assert out.logprobs[1].logprob == pytest.approx(biased)  # log(e^10 / (e^10 + 49))


PENALTY = 1.3
MAX_NEW = 16


def test_greedy_repetition_penalty_matches_hf_generate(model, tokenizer, hf_model):
    """Two penalized requests share each step with a free one; each penalized answer must
    equal transformers' generate(repetition_penalty=1.3) token for token."""
    texts = ["The cat sat on the mat. The cat sat on the", "One, two, three, one, two,"]
    prompts = [tokenizer(t).input_ids for t in texts]
    engine = BatchEngine(EngineConfig(num_blocks=64), model, tokenizer)
    outputs: dict[str, list[RequestOutput]] = {}
    for i, ids in enumerate([*prompts, prompts[0]]):
        penalty = PENALTY if i < len(prompts) else 1.0
        outputs[str(i)] = []
        engine.add_request(Request(str(i), ids, SamplingParams(
            max_tokens=MAX_NEW, temperature=0, ignore_eos=True, repetition_penalty=penalty),
            on_output=outputs[str(i)].append))
    while not all(o and o[-1].finished for o in outputs.values()):
        engine.step()
    ours = [[t for o in outputs[str(i)] for t in o.token_ids] for i in range(3)]
    for i, ids in enumerate(prompts):
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                repetition_penalty=PENALTY,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        theirs = out[0, len(ids):].tolist()
        print(f"prompt {i}: ours {ours[i]}\n          hf   {theirs}")
        assert ours[i] == theirs
    print("free:", ours[2])
    assert ours[2] != ours[0]  # the penalty changed something
