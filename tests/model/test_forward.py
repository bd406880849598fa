"""Our forward pass against Hugging Face's LlamaForCausalLM, piece by piece, on logits."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from model.kernels.build import load_fused_ops
from model.layers import use_fused_ops
from model.llama import RotaryEmbedding, causal_attention
from model.loader import load_model
from tests.conftest import LOGITS_ATOL, PROMPTS

torch.set_grad_enabled(False)


@pytest.fixture(params=["fused-ops", "pytorch-ops"], autouse=True)
def ops(request, model):
    """Every test here runs twice: with the compiled fused ops (what the engine runs on a CPU)
    and with the plain PyTorch ops (the reference, and what other devices run)."""
    fused = load_fused_ops()
    if request.param == "fused-ops" and fused is None:
        pytest.skip("the fused ops could not be built here")
    use_fused_ops(model, fused if request.param == "fused-ops" else None)
    yield
    use_fused_ops(model, fused)  # the session model's default


# Pieces are compared relative to the reference's largest value: an MLP on random input
# gives outputs near 900, where fp32 rounding alone is ~1e-4 absolute (~5e-7 relative; Hugging
# Face's own result is as far from a float64 reference). A real bug is off by far more.
PIECE_RTOL = 1e-5


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def rel_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return max_diff(ours, ref) / ref.abs().max().item()


def hf_causal_mask(seq_len: int) -> torch.Tensor:
    mask = torch.full((seq_len, seq_len), float("-inf")).triu(1)
    return mask[None, None]


def hidden_input(seq_len: int = 7, hidden: int = 576) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(1, seq_len, hidden), torch.arange(seq_len)[None]


def test_rmsnorm(model, hf_model):
    x, _ = hidden_input()
    diff = rel_diff(model.layers[3].input_layernorm(x), hf_model.model.layers[3].input_layernorm(x))
    print(f"RMSNorm relative max |diff| = {diff:.2e} (tolerance {PIECE_RTOL:.0e})")
    assert diff < PIECE_RTOL


def test_rope(model, hf_model):
    torch.manual_seed(2)
    q, k = torch.randn(1, 9, 40, 64), torch.randn(1, 3, 40, 64)  # HF layout: [b, heads, seq, dim]
    positions = torch.arange(100, 140)[None]
    cos, sin = hf_model.model.rotary_emb(q, positions)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    our_cos, our_sin = model.rotary.table(positions)
    ours_q = RotaryEmbedding.apply(q.transpose(1, 2), our_cos, our_sin).transpose(1, 2)
    ours_k = RotaryEmbedding.apply(k.transpose(1, 2), our_cos, our_sin).transpose(1, 2)
    diff = max(rel_diff(ours_q, hf_q), rel_diff(ours_k, hf_k))
    print(f"RoPE (positions 100..139) relative max |diff| = {diff:.2e}")
    assert diff < PIECE_RTOL


def test_attention_block(model, hf_model):
    x, positions = hidden_input()
    hf_attn = hf_model.model.layers[5].self_attn
    hf_out, _ = hf_attn(x, position_embeddings=hf_model.model.rotary_emb(x, positions),
                        attention_mask=hf_causal_mask(x.shape[1]))
    ours = model.layers[5].self_attn(x, model.rotary.table(positions), causal_attention)
    diff = rel_diff(ours, hf_out)
    print(f"attention block relative max |diff| = {diff:.2e}")
    assert diff < PIECE_RTOL


def test_mlp(model, hf_model):
    x, _ = hidden_input()
    diff = rel_diff(model.layers[7].mlp(x), hf_model.model.layers[7].mlp(x))
    print(f"MLP relative max |diff| = {diff:.2e}")
    assert diff < PIECE_RTOL


def test_one_decoder_layer(model, hf_model):
    x, positions = hidden_input()
    hf_out = hf_model.model.layers[11](
        x, attention_mask=hf_causal_mask(x.shape[1]), position_ids=positions,
        position_embeddings=hf_model.model.rotary_emb(x, positions),
    )
    hf_out = hf_out[0] if isinstance(hf_out, tuple) else hf_out
    out, residual = model.layers[11](x, None, model.rotary.table(positions), causal_attention)
    ours = residual + out  # the block's output added to the residual stream, as HF returns it
    diff = rel_diff(ours, hf_out)
    print(f"decoder layer relative max |diff| = {diff:.2e}")
    assert diff < PIECE_RTOL


def full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, torch.arange(ids.shape[1])[None], causal_attention)


def test_logits_match_hf(model, hf_model, tokenizer, model_dir):
    exact = load_model(model_dir, dtype=torch.float64)  # the same math without fp32 rounding
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        ours, theirs = full_logits(model, ids), hf_model(ids).logits
        truth = full_logits(exact, ids)
        diff = max_diff(ours, theirs)
        ours_err, hf_err = max_diff(ours.double(), truth), max_diff(theirs.double(), truth)
        print(f"{ids.shape[1]:3d} tokens: logits max |ours - HF| = {diff:.2e} "
              f"(tolerance {LOGITS_ATOL:.0e}); vs float64: ours {ours_err:.2e}, HF {hf_err:.2e}")
        assert diff < LOGITS_ATOL
        assert ours_err < 2 * hf_err + 1e-5  # our rounding error is of HF's size, not larger
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_broken_rope_fails_logits_check(model, hf_model, tokenizer):
    """RoPE with theta 10,000 instead of 100,000 must be caught by the logits comparison."""
    good_rotary = model.rotary
    model.rotary = RotaryEmbedding(64, 10_000.0, model.cfg.max_position_embeddings)
    try:
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            ours, theirs = full_logits(model, ids), hf_model(ids).logits
            diff = max_diff(ours, theirs)
            same_top = torch.equal(ours[0, -1].argmax(), theirs[0, -1].argmax())
            print(f"broken RoPE, {ids.shape[1]:3d} tokens: logits max |diff| = {diff:.2e}; "
                  f"a top-token-only check on the last token would have "
                  f"{'PASSED' if same_top else 'failed'}")
            assert diff > 100 * LOGITS_ATOL
    finally:
        model.rotary = good_rotary
