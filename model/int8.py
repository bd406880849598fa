"""`--weights int8`: weight-only int8, one scale per output channel, for any model folder.

Quantized at load from the fp32 (or bf16, upcast) weights: w ≈ d_row * q with q in
[-127, 127] and d_row = max |w_row| / 127. Unlike q4_1 this changes the model, so its
accuracy is measured (benchmarks/studies/quant_accuracy.py). The matmuls run on the Q8_0 kernel of
model/quantized.py, which takes a scale per 32 inputs: here each row repeats its one scale.
Activations stay fp32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from model.gguf_weights import BLOCK, BlockTensor
from model.llama import Linear, LlamaModel
from model.loader import load_model
from model.quantized import QuantizedEmbedding, QuantizedLinear, quantized_kernels

SMALLEST_SCALE = 2.0**-14  # fp16's smallest normal number; the kernel reads fp16 scales


def int8_per_channel(weight: Tensor) -> BlockTensor:
    """[out, in] weights -> int8 codes with one fp16 scale per row, as Q8_0 blocks."""
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"int8 weights need a multiple of {BLOCK} inputs, got {cols}")
    w = weight.float()
    peak = w.abs().amax(dim=1)
    # The scale is rounded to fp16 first, and the codes are computed with that scale.
    scale = torch.where(peak > 0, (peak / 127).clamp_min(SMALLEST_SCALE), 0).half()
    d = scale.float().unsqueeze(1)
    codes = torch.where(d > 0, w / d.clamp_min(SMALLEST_SCALE), 0).round().clamp(-127, 127)
    blocks = torch.empty(rows, cols // BLOCK, 2 + BLOCK, dtype=torch.uint8)
    blocks[..., :2] = scale.view(torch.uint8).reshape(rows, 1, 2)
    blocks[..., 2:] = codes.to(torch.int8).view(torch.uint8).reshape(rows, -1, BLOCK)
    return BlockTensor("Q8_0", blocks)


def _quantize(linear: Linear) -> QuantizedLinear:
    return QuantizedLinear(int8_per_channel(linear.weight_t.t()))


def quantize_model_int8(model: LlamaModel) -> None:
    """Swap every linear layer, the LM head and the embedding for int8 ones (in place).

    The model must be on the CPU in float32 (load a bf16 folder with dtype float32)."""
    weight = model.norm.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"--weights int8 runs on the CPU in float32; the model is on "
                         f"{weight.device} in {weight.dtype}")
    if model.cfg.qkv_bias:
        raise ValueError(f"--weights int8 does not quantize {model.cfg.model_type} (its q/k/v "
                         "biases); serve it with --weights default")
    if model.cfg.model_type == "gemma3_text":  # no accuracy check of it exists yet
        raise ValueError("--weights int8 has not been checked on gemma3_text; serve it with "
                         "--weights default")
    quantized_kernels()  # fail before touching the model if the kernel cannot run
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj, attn.o_proj = _quantize(attn.qkv_proj), _quantize(attn.o_proj)
        mlp.gate_up_proj, mlp.down_proj = _quantize(mlp.gate_up_proj), _quantize(mlp.down_proj)
    if model.cfg.tie_word_embeddings:  # one set of codes serves both
        model.lm_head = _quantize(model.lm_head)
        model.embed_tokens = QuantizedEmbedding(model.lm_head)
    else:
        model.lm_head = _quantize(model.lm_head)
        embedding = int8_per_channel(model.embed_tokens.weight)
        model.embed_tokens = QuantizedEmbedding(QuantizedLinear(embedding))


def load_int8_model(model_dir: str | Path) -> LlamaModel:
    """`--weights int8`: load the folder in float32, then quantize it to int8."""
    model = load_model(model_dir, dtype=torch.float32, matmul="torch")  # Linear layers to swap
    quantize_model_int8(model)
    return model
