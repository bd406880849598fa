"""`--weights int8`: weight-only int8, one scale per output channel, for any model folder.

Quantized at load from the fp32 (or bf16, upcast) weights: w ≈ d_row * q with q in
[-127, 127] and d_row = max |w_row| / 127. Unlike q4_1 this changes the model, so its
accuracy is measured (benchmarks/studies/quant_accuracy.py). The matmuls run on the Q8_0 kernel of
model/weights/quantized.py, which takes a scale per 32 inputs: here each row repeats its one scale.
Activations stay fp32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from model.checkpoint import Checkpoint, read_checkpoint, replace, weight_units
from model.config import ModelConfig
from model.kernels.build import load_fused_ops
from model.layers import Linear, log_torch_pieces, use_fused_ops
from model.llama import LlamaModel
from model.weights.blocks import BLOCK, BlockTensor
from model.weights.quantized import QuantizedEmbedding, QuantizedLinear, quantized_kernels

SMALLEST_SCALE = 2.0**-14  # fp16's smallest normal number; the kernel reads fp16 scales


def q8_0_blocks(weight: Tensor) -> BlockTensor:
    """[out, in] weights -> GGUF's Q8_0: int8 codes with one fp16 scale per block of 32
    inputs, d = max |w_block| / 127 (rounded to fp16 first, the codes computed with it)."""
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"Q8_0 weights need a multiple of {BLOCK} inputs, got {cols}")
    w = weight.float().reshape(rows, cols // BLOCK, BLOCK)
    peak = w.abs().amax(dim=-1)
    scale = torch.where(peak > 0, (peak / 127).clamp_min(SMALLEST_SCALE), 0).half()
    d = scale.float().unsqueeze(-1)
    codes = torch.where(d > 0, w / d.clamp_min(SMALLEST_SCALE), 0).round().clamp(-127, 127)
    blocks = torch.empty(rows, cols // BLOCK, 2 + BLOCK, dtype=torch.uint8)
    blocks[..., :2] = scale.view(torch.uint8).reshape(rows, cols // BLOCK, 2)
    blocks[..., 2:] = codes.to(torch.int8).view(torch.uint8)
    return BlockTensor("Q8_0", blocks)


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


class Int8Weights:
    """`--weights int8` as a weight format (model/checkpoint.py): a folder's checkpoint read
    as for the default weights, each linear layer and the LM head quantized as it is built
    (never a whole fp32 model beside the codes), the embedding read from codes too. The
    norms are upcast to float32; the model runs on the CPU."""

    def __init__(self, fused_ops: bool = True) -> None:
        self.fused_ops = fused_ops

    def read(self, path: Path) -> Checkpoint:
        from model.weights.gguf_format import refuse_gguf_file

        refuse_gguf_file(path, "int8")
        return read_checkpoint(path)

    def check(self, cfg: ModelConfig) -> None:
        if cfg.qkv_bias:
            raise ValueError(f"--weights int8 does not quantize {cfg.model_type} (its q/k/v "
                             "biases); serve it with --weights default")
        if cfg.model_type == "gemma3_text":  # no accuracy check of it exists yet
            raise ValueError("--weights int8 has not been checked on gemma3_text; serve it "
                             "with --weights default")
        quantized_kernels()  # fail before building anything if the kernel cannot run

    def linear(self, name: str, module: nn.Module, weights: list[Tensor],
               biases: list[Tensor] | None) -> QuantizedLinear:
        assert biases is None  # refused by check()
        return QuantizedLinear(int8_per_channel(torch.cat(weights)))

    def embedding_and_head(self, model: nn.Module, embedding: Tensor,
                           head: Tensor | None) -> None:
        model.lm_head = QuantizedLinear(int8_per_channel(embedding if head is None else head))
        if head is None:  # tied: one set of codes serves both
            model.embed_tokens = QuantizedEmbedding(model.lm_head)
        else:
            model.embed_tokens = QuantizedEmbedding(blocks=int8_per_channel(embedding))

    def finish(self, model: nn.Module) -> nn.Module:
        model = model.to(dtype=torch.float32).eval().requires_grad_(False)
        if self.fused_ops:
            use_fused_ops(model, load_fused_ops())
            log_torch_pieces(model.cfg)
        return model


def quantize_model_int8(model: LlamaModel) -> None:
    """Swap every linear layer, the LM head and the embedding for int8 ones (in place), as
    `Int8Weights` builds them.

    The model must be on the CPU in float32 (load a bf16 folder with dtype float32), with
    PyTorch's matmuls (matmul="torch")."""
    weight = model.norm.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"--weights int8 runs on the CPU in float32; the model is on "
                         f"{weight.device} in {weight.dtype}")
    fmt = Int8Weights()
    fmt.check(model.cfg)
    for name, module in list(weight_units(model)):
        if isinstance(module, Linear):
            replace(model, name, fmt.linear(name, module, [module.weight_t.t()], None))
    head = None if model.cfg.tie_word_embeddings else model.lm_head.weight_t.t()
    fmt.embedding_and_head(model, model.embed_tokens.weight, head)
