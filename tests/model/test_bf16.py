"""bfloat16 serving against our own fp32 logits, with a tolerance of its own.

Why not the fp32 tolerance (3e-4): bf16 keeps 8 significant bits, and in a bf16 forward pass
every activation is rounded to them after every op, not only the weights. Measured here on
the test prompts: rounding only the weights to bf16 moves the logits by ~0.03 on average;
the whole bf16 pass by 0.11-0.28 on average (max ~2 on logits up to ~40), and the
next-token distributions differ by a KL divergence of 0.0015-0.003 nats per position.
So the check is on distributions: mean KL(fp32 || bf16) below 0.01 per position, and the
same top token at 80% or more of positions. A RoPE with the wrong theta in bf16 gives a KL
of 0.03-0.04 on the longer prompts and is caught (see the last test).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.layers import RotaryEmbedding, causal_attention
from model.loader import load_model
from tests.conftest import PROMPTS

KL_TOLERANCE = 0.01  # nats per position, mean over a prompt
TOP1_AGREEMENT = 0.8
GREEDY_TOKENS = 32


@pytest.fixture(scope="session")
def bf16_model(model_dir):
    return load_model(model_dir, dtype=torch.bfloat16)


def logits(model, ids: list[int]) -> torch.Tensor:
    t = torch.tensor([ids])
    return model(t, torch.arange(len(ids))[None], causal_attention)[0].float()


def kl_per_position(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return F.kl_div(other.log_softmax(-1), reference.log_softmax(-1), log_target=True,
                    reduction="none").sum(-1)


def test_bf16_logits_within_their_tolerance(model, bf16_model, tokenizer):
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        ours32, ours16 = logits(model, ids), logits(bf16_model, ids)
        kl = kl_per_position(ours32, ours16).mean().item()
        top1 = (ours32.argmax(-1) == ours16.argmax(-1)).float().mean().item()
        diff = (ours32 - ours16).abs()
        print(f"{len(ids):3d} tokens: bf16 vs fp32 mean KL {kl:.4f} (tolerance {KL_TOLERANCE}), "
              f"top-1 agreement {top1:.2f}, |logit diff| mean {diff.mean():.3f} "
              f"max {diff.max():.2f}")
        assert kl < KL_TOLERANCE
        assert top1 >= TOP1_AGREEMENT


def test_broken_rope_in_bf16_fails_the_bf16_check(bf16_model, model, tokenizer):
    good = bf16_model.rotary
    bf16_model.rotary = RotaryEmbedding(64, 10_000.0, model.cfg.max_position_embeddings).to(
        torch.bfloat16)
    try:
        worst = 0.0
        for prompt in PROMPTS:
            ids = tokenizer(prompt).input_ids
            kl = kl_per_position(logits(model, ids), logits(bf16_model, ids)).mean().item()
            print(f"broken RoPE in bf16, {len(ids):3d} tokens: mean KL {kl:.4f}")
            worst = max(worst, kl)
        assert worst > KL_TOLERANCE
    finally:
        bf16_model.rotary = good


def test_greedy_agreement_of_bf16_serving_with_fp32(model, bf16_model, tokenizer):
    """The figure the README reports: how long bf16 greedy answers stay identical to fp32's,
    through the real engine (paged cache, batched decode, the bf16 attention kernel)."""
    from engine.batch_engine import BatchEngine
    from engine.config import EngineConfig
    from tests.engine.test_engine import QUESTIONS, run

    prompts = [tokenizer(q).input_ids for q in QUESTIONS]
    answers = {}
    for name, m in (("fp32", model), ("bf16", bf16_model)):
        engine = BatchEngine(EngineConfig(num_blocks=128), m, tokenizer)
        answers[name], _ = run(engine, prompts, [0] * len(prompts), max_tokens=GREEDY_TOKENS,
                               ignore_eos=True)
    same_prefix = []
    for a, b in zip(answers["fp32"], answers["bf16"]):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        same_prefix.append(n)
    identical = sum(n == GREEDY_TOKENS for n in same_prefix)
    share = sum(same_prefix) / (GREEDY_TOKENS * len(prompts))
    print(f"bf16 vs fp32 greedy, {len(prompts)} prompts x {GREEDY_TOKENS} tokens: identical "
          f"answers {identical}/{len(prompts)}; tokens before the first difference "
          f"{same_prefix} ({share:.0%} of all)")
    # Measured: 4/10 identical, 65% of tokens before the first difference. Near-ties between
    # two tokens flip under bf16 rounding and the answers then part ways; a broken bf16 path
    # parts at once. So: every answer starts like fp32's, and most tokens agree.
    assert min(same_prefix) >= 1 and share >= 0.5
