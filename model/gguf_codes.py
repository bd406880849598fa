"""A GGUF file's own codes in the forms our quantized kernels take (model/quantized.py), for
`--weights q4_1` on a GGUF file: every matrix of a type a kernel computes exactly stays in
its codes; the others are dequantized to fp32 (the same weights either way).

The kernels take blocks of 32 weights along the input dim (model/gguf_weights.py
BlockTensor). Q4_1, Q8_0 and Q5_0 are such blocks already and are kept as the file has them.
llama.cpp's K-quants pack 256 weights a super-block with one fp16 scale and 6- or 8-bit
sub-scales; they are rewritten here, once at load, as blocks of 32 with fp32 scales:

- Q4_K (144 bytes per 256): fp16 d and dmin, eight 6-bit sub-scales sc and sub-mins mn, 4-bit
  codes q; w = (d * sc) * q - (dmin * mn). As 24-byte blocks: s = d * sc and m = -dmin * mn in
  fp32 (both exact: 11 + 6 significant bits), then 16 bytes of codes laid out as Q4_1's
  (byte j: weight j low, weight j + 16 high). w = s * q + m, one rounding, as gguf computes.
- Q6_K (210 bytes per 256): fp16 d, sixteen int8 sub-scales (one per 16 weights), 6-bit codes
  q - 32; w = (d * sc) * (q - 32). As 40-byte blocks: s0 and s1 = d * sc for the two halves
  in fp32, then 32 int8 codes (q - 32). Every product is exact in fp32 (at most 11 + 7 + 5
  significant bits), so w is too.

A fused module (q/k/v, gate/up) whose parts are of different types takes the smallest type
that holds every part exactly: Q5_0 and Q8_0 as Q8_0 (codes q - 16 are int8), those and Q6_K
as Q6_K's form, Q4_1 and Q4_K as Q4_K's. Other mixes are dequantized.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
from torch import Tensor, nn

from model.gguf_weights import BlockTensor

KERNEL_TYPES = ("Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K")  # GGUF types kept in their codes
RAW_BYTES = {"Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}  # per GGUF block
SUPER = 256  # weights per K-quant super-block
# A part's type -> the types that hold it exactly, smallest first.
HOLDERS = {"Q5_0": ("Q5_0", "Q8_0", "Q6_K"), "Q8_0": ("Q8_0", "Q6_K"), "Q6_K": ("Q6_K",),
           "Q4_1": ("Q4_1", "Q4_K"), "Q4_K": ("Q4_K",)}


def fp32_bytes(values: Tensor) -> Tensor:
    """fp32 [..., n] -> its bytes [..., 4 n]."""
    return values.contiguous().view(torch.uint8).reshape(*values.shape[:-1], -1)


def q4_k_sub_scales(scales: Tensor) -> tuple[Tensor, Tensor]:
    """12 bytes a super-block -> its eight 6-bit scales and mins ([..., 8] each, int)."""
    s = scales.to(torch.int32)
    low, mid, high = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([low & 63, (high & 15) | ((low >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 63, (high >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, mn


def q4_k_blocks(raw: Tensor) -> BlockTensor:
    """Q4_K super-blocks uint8 [rows, n, 144] -> 24-byte blocks of 32 [rows, 8 n, 24]."""
    rows, n = raw.shape[:2]
    d = raw[..., 0:2].contiguous().view(torch.float16).float()  # [rows, n, 1]
    dmin = raw[..., 2:4].contiguous().view(torch.float16).float()
    sc, mn = q4_k_sub_scales(raw[..., 4:16])
    s, m = d * sc.float(), -(dmin * mn.float())  # [rows, n, 8], exact
    qs = raw[..., 16:].reshape(rows, n, 4, 1, 32)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(rows, n, 8, 32)  # sub-block 2c, 2c + 1
    packed = q[..., :16] | (q[..., 16:] << 4)  # Q4_1's byte order
    blocks = torch.cat([fp32_bytes(s.unsqueeze(-1)), fp32_bytes(m.unsqueeze(-1)), packed], -1)
    return BlockTensor("Q4_K", blocks.reshape(rows, n * 8, 24))


def q6_k_blocks(raw: Tensor) -> BlockTensor:
    """Q6_K super-blocks uint8 [rows, n, 210] -> 40-byte blocks of 32 [rows, 8 n, 40]."""
    rows, n = raw.shape[:2]
    ql = raw[..., 0:128].reshape(rows, n, 2, 1, 64)
    qh = raw[..., 128:192].reshape(rows, n, 2, 1, 32)
    sc = raw[..., 192:208].contiguous().view(torch.int8).float()  # [rows, n, 16]
    d = raw[..., 208:210].contiguous().view(torch.float16).float()
    low = torch.cat([ql & 0x0F, ql >> 4], dim=3).reshape(rows, n, 2, 128)
    high = torch.cat([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], dim=3).reshape(rows, n, 2,
                                                                                   128)
    q = ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).reshape(rows, n, 8, 32)
    s = (d * sc).reshape(rows, n, 8, 2)  # one per 16 weights, exact
    blocks = torch.cat([fp32_bytes(s), q.view(torch.uint8)], dim=-1)
    return BlockTensor("Q6_K", blocks.reshape(rows, n * 8, 40))


def block_tensor(kind: str, data: Tensor) -> BlockTensor:
    """A GGUF tensor's bytes, uint8 [rows, bytes a row], in its kernel's form."""
    rows = data.shape[0]
    raw = data.reshape(rows, -1, RAW_BYTES[kind])
    if kind == "Q4_K":
        return q4_k_blocks(raw)
    if kind == "Q6_K":
        return q6_k_blocks(raw)
    return BlockTensor(kind, raw)


def as_kind(weight: BlockTensor, kind: str) -> BlockTensor:
    """The same weights in another form that holds them exactly (HOLDERS)."""
    if weight.kind == kind:
        return weight
    if kind not in HOLDERS[weight.kind]:
        raise ValueError(f"{weight.kind} blocks do not convert exactly to {kind}")
    b = weight.blocks
    if kind == "Q4_K":  # from Q4_1: the fp16 d and m as fp32
        scale_min = b[..., 0:4].contiguous().view(torch.float16).float()
        return BlockTensor(kind, torch.cat([fp32_bytes(scale_min), b[..., 4:]], dim=-1))
    codes = weight.codes().to(torch.int8)  # Q5_0's q - 16, or Q8_0's q: [rows, blocks, 32]
    if kind == "Q8_0":
        return BlockTensor(kind, torch.cat([b[..., 0:2], codes.view(torch.uint8)], dim=-1))
    d = weight.scales().unsqueeze(-1)  # Q6_K's form: d for both halves
    return BlockTensor(kind, torch.cat([fp32_bytes(torch.cat([d, d], -1)),
                                        codes.view(torch.uint8)], dim=-1))


def fuse(parts: list[BlockTensor]) -> BlockTensor | None:
    """The parts stacked along rows in the smallest form that holds them all exactly, or None
    where none does."""
    kinds = [p.kind for p in parts]
    common = [k for k in HOLDERS[kinds[0]] if all(k in HOLDERS[other] for other in kinds)]
    if not common:
        return None
    return BlockTensor.cat([as_kind(p, common[0]) for p in parts])



def report_and_pack(model: nn.Module, dequantized: list[str], types: dict[str, str]) -> None:
    """Log what a GGUF file's matrices run on (the kernels by type, the dequantized modules
    with the types they came from); pack the dequantized ones for our dense GEMM."""
    from model.quantized import QuantizedLinear
    from model.registry import architecture

    log = logging.getLogger("nano_vllm.kernel")
    kinds = Counter(m.kind for m in model.modules() if isinstance(m, QuantizedLinear))
    log.info("--weights q4_1 on a %s GGUF: %s on their own codes", model.cfg.model_type,
             ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    if not dequantized:
        return
    from model.dense_linear import pack_model_linears

    arch = architecture(model.cfg.model_type)

    def source(name: str) -> str:
        parts = arch.checkpoint_modules(name, model.cfg)
        return "/".join(types.get(f"{part}.weight", "?") for part in parts)

    log.info("dequantized to fp32 (no exact kernel takes their types): %s",
             ", ".join(f"{name} ({source(name)})" for name in dequantized))
    pack_model_linears(model)
