"""Gemma 3 270M in bfloat16 and with `--lm-head q8_0`, against our own fp32 logits of the
same GGUF file; and the Q8_0 head made at load from fp32 weights (the default model).

- bf16: the tolerance of tests/model/test_bf16.py (mean KL(fp32 || bf16) per position below
  0.01 nats, the same top token at 80% of positions or more).
- Q8_0 head on the file's own codes: Gemma's tied embedding is stored as Q8_0 in the
  Q4_K_M file, and our fp32 model is those codes dequantized, so the kernel computes the
  same head up to summation order: the fp32 tolerance (3e-4 on every logit).
- Q8_0 head made at load (a folder's fp32 head rounded to Q8_0 blocks): the bf16 tolerance,
  on a tiny random model; the default model's head is already dequantized Q8_0 and comes
  back exactly.

The Gemma tests need the cached file (`gemma-3-270m`, fetched by
benchmarks/gemma3_gguf_check.py) and skip without it rather than download (under CI, which
fetches it, they fail); three models are
loaded from it (about a minute).
"""

from __future__ import annotations

import pytest
import torch

from model.gguf.source import load_tokenizer, release_path
from model.loader import load_model
from model.weights.int8 import q8_0_blocks
from model.weights.quantized import (
    QuantizedEmbedding,
    QuantizedKernelUnavailable,
    QuantizedLinear,
    quantized_kernels,
)
from tests.conftest import LOGITS_ATOL, PROMPTS, missing
from tests.model.test_architectures import save_tiny
from tests.model.test_bf16 import KL_TOLERANCE, TOP1_AGREEMENT, kl_per_position, logits

torch.set_grad_enabled(False)
GEMMA = release_path("gemma-3-270m")


def gemma_or_skip() -> None:
    if not GEMMA.is_file():
        missing(f"{GEMMA} (python3 -m model.gguf.source gemma-3-270m fetches it)")


def kernel_or_skip() -> None:
    try:
        quantized_kernels()
    except QuantizedKernelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def gemma_fp32():
    gemma_or_skip()
    return load_model(GEMMA)


@pytest.fixture(scope="module")
def gemma_tokenizer():
    gemma_or_skip()
    return load_tokenizer(GEMMA)


def check_distributions(reference, other, tokenizer, label: str) -> None:
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        ref, ours = logits(reference, ids), logits(other, ids)
        kl = kl_per_position(ref, ours).mean().item()
        top1 = (ref.argmax(-1) == ours.argmax(-1)).float().mean().item()
        print(f"{label}, {len(ids):3d} tokens: mean KL {kl:.5f} (tolerance {KL_TOLERANCE}), "
              f"top-1 agreement {top1:.2f}, max |logit diff| {(ref - ours).abs().max():.3f}")
        assert kl < KL_TOLERANCE
        assert top1 >= TOP1_AGREEMENT


def test_gemma3_bf16_within_the_bf16_tolerance(gemma_fp32, gemma_tokenizer):
    check_distributions(gemma_fp32, load_model(GEMMA, dtype=torch.bfloat16), gemma_tokenizer,
                        "gemma3 bf16")


def test_gemma3_q8_0_head_runs_the_files_codes_exactly(gemma_fp32, gemma_tokenizer):
    kernel_or_skip()
    q8 = load_model(GEMMA, lm_head="q8_0")
    assert isinstance(q8.lm_head, QuantizedLinear) and q8.lm_head.kind == "Q8_0"
    assert isinstance(q8.embed_tokens, QuantizedEmbedding)  # rows read from the same codes
    for prompt in PROMPTS:
        ids = gemma_tokenizer(prompt).input_ids
        ref, ours = logits(gemma_fp32, ids), logits(q8, ids)
        diff = (ref - ours).abs().max().item()
        print(f"gemma3 q8_0 head, {len(ids):3d} tokens: max |logit diff| {diff:.2e} "
              f"(tolerance {LOGITS_ATOL:.0e})")
        assert diff <= LOGITS_ATOL
        assert torch.equal(ref.argmax(-1), ours.argmax(-1))


def test_q8_0_head_made_at_load_from_dequantized_q8_0_gives_back_its_codes(model, model_dir,
                                                                          tokenizer):
    """The default folder's head is its GGUF's Q8_0 embedding dequantized: rounding it to Q8_0
    blocks again finds the same scales and codes, so the logits keep the fp32 tolerance."""
    kernel_or_skip()
    q8 = load_model(model_dir, lm_head="q8_0")
    assert isinstance(q8.lm_head, QuantizedLinear)
    assert isinstance(q8.embed_tokens, torch.nn.Embedding)  # the folder's own rows
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        diff = (logits(model, ids) - logits(q8, ids)).abs().max().item()
        assert diff <= LOGITS_ATOL, diff


def test_q8_0_head_made_at_load_within_the_bf16_tolerance(tmp_path, tokenizer):
    """A head of plain fp32 weights (a tiny random Qwen3, untied) rounded to Q8_0 at load."""
    kernel_or_skip()
    save_tiny("qwen3", tmp_path)
    check_distributions(load_model(tmp_path), load_model(tmp_path, lm_head="q8_0"), tokenizer,
                        "tiny qwen3, q8_0 head made at load")


def test_q8_0_blocks_round_each_weight_to_its_blocks_step():
    w = torch.randn(48, 96) * torch.logspace(-3, 1, 48)[:, None]
    blocks = q8_0_blocks(w)
    d = blocks.scales().repeat_interleave(32, dim=1)
    error = (blocks.dequantize() - w).abs()
    peak = w.abs().reshape(48, 3, 32).amax(-1).repeat_interleave(32, dim=1)
    assert bool((error <= d / 2 + peak * 2**-10).all())  # half a step, plus d's fp16 rounding
    assert torch.equal(q8_0_blocks(torch.zeros(16, 32)).dequantize(), torch.zeros(16, 32))


def test_q8_0_head_refuses_bf16():
    with pytest.raises(ValueError, match="float32"):
        load_model(GEMMA, dtype=torch.bfloat16, lm_head="q8_0")
