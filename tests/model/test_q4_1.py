"""`--weights q4_1`: the GGUF's codes, the kernel on them, and the whole model against fp32/HF."""

from __future__ import annotations

import pytest
import torch

from model.gguf.llama_codes import GGUFModel, read_gguf
from model.llama import LlamaModel, causal_attention
from model.loader import load_model, load_q4_1_model
from model.prepare import fetch_default_gguf
from model.weights import quantized
from model.weights.blocks import BlockTensor
from model.weights.gguf_format import quantize_model_q4_1
from model.weights.quantized import QuantizedEmbedding, QuantizedKernelUnavailable, QuantizedLinear
from tests.conftest import LOGITS_ATOL, PROMPTS
from tests.model import test_paged_attention as paged

torch.set_grad_enabled(False)
# One row, partial and full tiles (AVX2: 4 rows, AVX-512: 8), a decode batch, past it, and
# prefill chunks past 64 rows (each row tile over the whole dequantized panel).
ROWS = [1, 3, 4, 5, 8, 30, 33, 70, 131]


def kernel_or_skip() -> None:
    try:
        quantized.quantized_kernels()
    except QuantizedKernelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def gguf() -> GGUFModel:
    return read_gguf(fetch_default_gguf())


@pytest.fixture(scope="module")
def q4_1_model(model_dir) -> LlamaModel:
    """Built straight from the GGUF, as `--weights q4_1` does."""
    kernel_or_skip()
    return load_q4_1_model(model_dir)


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> BlockTensor:
    """Random codes with scales and minimums of the real weights' size."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, cols // 32, 20 if kind == "Q4_1" else 34),
                           dtype=torch.uint8, generator=g)
    halves = torch.empty(rows, cols // 32, 2, dtype=torch.float16)
    halves[..., 0].uniform_(1e-3, 2e-2, generator=g)  # d
    halves[..., 1].uniform_(-0.1, 0.0, generator=g)  # m (ignored by Q8_0: those are codes)
    width = 4 if kind == "Q4_1" else 2
    blocks[..., :width] = halves.view(torch.uint8).reshape(rows, cols // 32, 4)[..., :width]
    return BlockTensor(kind, blocks)


def check_against_reference(weight: BlockTensor, label: str, seed: int = 0) -> None:
    """Kernel vs the dequantized weights in float64; the fp32 matmul's error for scale."""
    layer = QuantizedLinear(weight)
    w = weight.dequantize()
    g = torch.Generator().manual_seed(seed)
    for rows in ROWS:
        x = torch.randn(rows, weight.cols, generator=g)
        truth = x.double() @ w.double().T
        scale = truth.abs().max().item()
        ours = (layer(x).double() - truth).abs().max().item() / scale
        fp32 = ((x @ w.T).double() - truth).abs().max().item() / scale
        print(f"{label} x {rows:2d} rows: relative error {ours:.1e} (fp32 matmul {fp32:.1e})")
        assert ours < 4e-6


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(960, 576), (1000, 1536), (40, 64)])
def test_kernel_matches_dequantized_weights_on_random_codes(kind, shape, quantized_path):
    """Row counts that are not a multiple of 16 (1000, 40) test the padded last group."""
    kernel_or_skip()
    check_against_reference(random_blocks(kind, *shape, seed=shape[0]), f"{kind} {shape}")


def test_kernel_matches_dequantized_weights_on_real_tensors(gguf, quantized_path):
    kernel_or_skip()
    for name in ("layers.0.self_attn.qkv_proj", "layers.5.mlp.gate_up_proj",
                 "layers.29.mlp.down_proj", "embed_tokens"):
        check_against_reference(gguf.quantized[name], name)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_many_rows_in_either_order_give_the_same_sums(kind, quantized_path):
    """Up to 64 rows every row walks a block before the next block; from 65 every row tile
    walks all the blocks before the next tile: a row's sums are the same bits either way."""
    kernel_or_skip()
    layer = QuantizedLinear(random_blocks(kind, 1000, 1536, seed=7))
    x = torch.randn(131, 1536, generator=torch.Generator().manual_seed(7))
    whole = layer(x)
    for rows in [slice(0, 9), slice(9, 73), slice(73, 131)]:
        assert torch.equal(whole[rows], layer(x[rows])), rows


def test_kernel_handles_leading_dims_and_empty_input():
    kernel_or_skip()
    layer = QuantizedLinear(random_blocks("Q4_1", 48, 64, seed=1))
    x = torch.randn(2, 5, 64)
    assert torch.equal(layer(x), layer(x.reshape(10, 64)).reshape(2, 5, 48))
    assert layer(torch.randn(0, 64)).shape == (0, 48)
    with pytest.raises(RuntimeError, match="float32"):
        layer(x.bfloat16())


def test_gguf_dequantizes_to_the_prepared_fp32_weights(gguf, model_dir):
    """The premise of exactness: the fp32 model *is* the dequantized GGUF, Q/K rows
    un-permuted, bit for bit."""
    state = load_model(model_dir, matmul="torch").state_dict()  # weights as loaded, unpacked
    for name, weight in gguf.quantized.items():
        ours = weight.dequantize()
        fp32 = state["embed_tokens.weight"] if name == "embed_tokens" else state[
            name + ".weight_t"].t()
        assert torch.equal(ours, fp32), name
    for name, tensor in gguf.dense.items():
        assert torch.equal(tensor, state[name]), name
    print(f"{len(gguf.quantized)} quantized and {len(gguf.dense)} fp32 tensors: bit-identical")


def test_embedding_lookup_is_exact(q4_1_model, model):
    ids = torch.tensor([[0, 1, 15, 16, 17], [49151, 12345, 2, 3, 4]])
    assert isinstance(q4_1_model.embed_tokens, QuantizedEmbedding)
    assert torch.equal(q4_1_model.embed_tokens(ids), model.embed_tokens(ids))


def test_quantized_model_is_small(q4_1_model):
    tensors = [*q4_1_model.parameters(), *q4_1_model.buffers()]
    megabytes = sum(t.numel() * t.element_size() for t in tensors) / 1e6
    kinds = {type(m).__name__ for m in q4_1_model.modules()}
    print(f"quantized model: {megabytes:.1f} MB of weights; modules {sorted(kinds)}")
    assert "Linear" not in kinds  # every fp32 linear layer was replaced
    assert megabytes < 110


def test_full_prompt_logits_match_fp32_and_hf(q4_1_model, model, hf_model, tokenizer):
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        positions = torch.arange(ids.shape[1])[None]
        ours = q4_1_model(ids, positions, causal_attention)
        fp32 = model(ids, positions, causal_attention)
        hf = hf_model(ids).logits
        vs_fp32, vs_hf = (ours - fp32).abs().max().item(), (ours - hf).abs().max().item()
        print(f"{ids.shape[1]:3d} tokens: q4_1 logits max |diff| vs fp32 {vs_fp32:.2e}, "
              f"vs HF {vs_hf:.2e} (tolerance {LOGITS_ATOL:.0e})")
        assert vs_fp32 < LOGITS_ATOL and vs_hf < LOGITS_ATOL
        assert torch.equal(ours.argmax(-1), hf.argmax(-1))


def test_swapping_a_loaded_fp32_model_gives_the_same_model(q4_1_model, model_dir, tokenizer):
    swapped = load_model(model_dir, matmul="torch")
    quantize_model_q4_1(swapped, fetch_default_gguf())
    ids = tokenizer(PROMPTS[2], return_tensors="pt").input_ids
    positions = torch.arange(ids.shape[1])[None]
    assert torch.equal(swapped(ids, positions, causal_attention),
                       q4_1_model(ids, positions, causal_attention))


def test_paged_paths_match_hf(q4_1_model, hf_model, tokenizer):
    """Paged prefill, prefix hit and batched decode (both attention backends), as for fp32."""
    for backend in paged.BACKENDS:
        paged.test_paged_prefill_matches_hf(q4_1_model, hf_model, tokenizer, backend)
        paged.test_prefix_hit_computes_only_the_rest_and_matches_hf(q4_1_model, hf_model,
                                                                     tokenizer, backend)
        paged.test_paged_decode_batch_of_different_lengths_matches_hf(
            q4_1_model, hf_model, tokenizer, backend)


def test_cpu_without_avx512_or_avx2_gets_a_clear_error(monkeypatch):
    monkeypatch.setattr(quantized, "cpu_supports_quantized", lambda: False)
    with pytest.raises(QuantizedKernelUnavailable, match=r"AVX-512.*or AVX2") as err:
        quantized.quantized_kernels()
    print("no AVX-512, no AVX2:", err.value)


def test_failed_build_gets_a_clear_error(monkeypatch):
    monkeypatch.setattr(quantized, "cpu_supports_quantized", lambda: True)
    monkeypatch.setattr(quantized, "load_cpu_kernels", lambda: None)
    monkeypatch.setattr(quantized, "cpu_kernels_error",
                        lambda: "RuntimeError: c++: command not found")
    with pytest.raises(QuantizedKernelUnavailable, match="command not found") as err:
        quantized.quantized_kernels()
    print("build failure:", err.value)


def test_wrong_model_or_dtype_is_rejected(model_dir):
    kernel_or_skip()
    bf16 = load_model(model_dir, dtype=torch.bfloat16, matmul="torch")
    with pytest.raises(ValueError, match="float32"):
        quantize_model_q4_1(bf16, fetch_default_gguf())
    shallow = load_model(model_dir, matmul="torch")
    del shallow.layers[1:]
    with pytest.raises(ValueError, match="layers"):
        quantize_model_q4_1(shallow, fetch_default_gguf())
