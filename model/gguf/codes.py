"""A GGUF file's own codes in the forms our quantized kernels take (model/weights/quantized.py):
every matrix of a quantized or 16-bit type runs on its own codes, exact to the fp32 model.

The kernels take units of weights along the input dim (model/weights/blocks.py BlockTensor).
Q4_1, Q8_0 and Q5_0 are blocks of 32 already and are kept as the file has them, F16 and BF16
as their values in blocks of 32. The others are rearranged here, once at load:

- Q4_K (144 bytes per 256): fp16 d and dmin, eight 6-bit sub-scales sc and sub-mins mn packed
  in 12 bytes, 4-bit codes q; w = (d * sc) * q - (dmin * mn). Kept as 256-weight units of 148
  bytes: d and dmin, sc and mn a byte each, each block's codes in Q4_1's byte order (byte j:
  weight j low, weight j + 16 high). The kernel forms s = d * sc and m = -dmin * mn in fp32
  (both exact: 11 + 6 significant bits), then w = s * q + m, one rounding, as gguf computes.
- Q6_K (210 bytes per 256): fp16 d, sixteen int8 sub-scales (one per 16 weights), 6-bit codes
  q; w = (d * sc) * (q - 32). Kept as 210-byte units: d, the sub-scales, each block's low
  nibbles in Q4_1's order and its high two bits four to a byte. Every product is exact in fp32
  (at most 11 + 7 + 6 significant bits), so w is too.
- Q4_0 (18 bytes per 32): fp16 d, 4-bit codes; w = d * (q - 8). As Q4_1 with m = -8 d (exact
  in fp16): d * q + m = d * (q - 8), one rounding of an exact value.
- Q5_K (176 bytes per 256): Q4_K's scales, 4-bit low codes and a fifth bit per weight. As
  28-byte blocks of 32: fp32 s and m, the 32 fifth bits as one uint32 (bit i: weight i), 16
  bytes of low codes as Q4_1's. w = s * q + m with q < 32, one rounding. Q5_1 (24 bytes per
  32: fp16 d and m, the same fifth bits and low codes) takes the same form with s = d.

A fused module (q/k/v, gate/up) whose parts share a type is one matrix; parts of different
types stay apart, each on its own kernel (model/weights/quantized.py PartsLinear).
"""

from __future__ import annotations

import torch
from torch import Tensor

from model.weights.blocks import BlockTensor

# GGUF types that run on their own codes, and their bytes per GGUF block.
RAW_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144,
             "Q5_K": 176, "Q6_K": 210, "F16": 64, "BF16": 64}
KERNEL_TYPES = tuple(RAW_BYTES)
# The kernel form each type is held in (model/weights/blocks.py), where it is not its own.
FORM_OF = {"Q4_0": "Q4_1", "Q5_1": "Q5_K"}
SUPER = 256  # weights per K-quant super-block
CHUNK_ROWS = 4096  # rows converted at a time
WEIGHTS_PER_BLOCK = {kind: SUPER if kind.endswith("_K") else 32 for kind in RAW_BYTES}


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
    """Q4_K super-blocks uint8 [rows, n, 144] -> our Q4_K units [rows, n, 148]: the same d
    and dmin, the eight 6-bit sub-scales and sub-mins a byte each, the codes of each block of
    32 in Q4_1's byte order."""
    rows, n = raw.shape[:2]
    sc, mn = q4_k_sub_scales(raw[..., 4:16])
    qs = raw[..., 16:].reshape(rows, n, 4, 1, 32)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(rows, n, 8, 32)  # sub-block 2c, 2c + 1
    packed = (q[..., :16] | (q[..., 16:] << 4)).reshape(rows, n, 128)
    return BlockTensor("Q4_K", torch.cat([raw[..., 0:4], sc.to(torch.uint8),
                                          mn.to(torch.uint8), packed], dim=-1))


def q6_k_blocks(raw: Tensor) -> BlockTensor:
    """Q6_K super-blocks uint8 [rows, n, 210] -> our Q6_K units [rows, n, 210]: d, the
    sixteen int8 sub-scales, then per block of 32 its low nibbles in Q4_1's byte order and its
    high two bits four to a byte (byte j: weights j, j + 8, j + 16, j + 24)."""
    rows, n = raw.shape[:2]
    ql = raw[..., 0:128].reshape(rows, n, 2, 1, 64)
    qh = raw[..., 128:192].reshape(rows, n, 2, 1, 32)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=3).reshape(rows, n, 2, 128)
    high = torch.cat([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], dim=3).reshape(rows, n, 2,
                                                                                   128)
    q = (low | (high << 4)).reshape(rows, n, 8, 32)  # 0..63, in weight order
    nibbles = ((q[..., :16] & 0x0F) | ((q[..., 16:] & 0x0F) << 4)).reshape(rows, n, 128)
    top = (q >> 4).reshape(rows, n, 8, 4, 8)  # [.., group of 8 weights, j]
    twos = (top[..., 0, :] | (top[..., 1, :] << 2) | (top[..., 2, :] << 4)
            | (top[..., 3, :] << 6)).reshape(rows, n, 64)
    return BlockTensor("Q6_K", torch.cat([raw[..., 208:210], raw[..., 192:208], nibbles, twos],
                                         dim=-1))


def q5_k_blocks(raw: Tensor) -> BlockTensor:
    """Q5_K super-blocks uint8 [rows, n, 176] -> 28-byte blocks of 32 [rows, 8 n, 28]."""
    rows, n = raw.shape[:2]
    d = raw[..., 0:2].contiguous().view(torch.float16).float()
    dmin = raw[..., 2:4].contiguous().view(torch.float16).float()
    sc, mn = q4_k_sub_scales(raw[..., 4:16])
    s, m = d * sc.float(), -(dmin * mn.float())  # [rows, n, 8], exact
    qh = raw[..., 16:48].reshape(rows, n, 1, 32)  # bit c of byte l: sub-block c's weight l
    qs = raw[..., 48:].reshape(rows, n, 4, 1, 32)
    low = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(rows, n, 8, 32)
    high = (qh >> torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)) & 1  # [rows, n, 8, 32]
    return five_bit_blocks(s, m, low, high, rows, n * 8)


def five_bit_blocks(s: Tensor, m: Tensor, low: Tensor, high: Tensor, rows: int,
                    blocks: int) -> BlockTensor:
    """Q5_K's form from fp32 s and m [..] and each weight's low 4 bits and fifth bit
    [.., 32] (uint8), in weight order."""
    packed = low[..., :16] | (low[..., 16:] << 4)  # Q4_1's byte order
    weights = 1 << torch.arange(32, dtype=torch.int64)
    bits = (high.to(torch.int64) * weights).sum(-1).to(torch.int32)  # bit i: weight i
    blocks_ = torch.cat([fp32_bytes(s.unsqueeze(-1)), fp32_bytes(m.unsqueeze(-1)),
                         bits.unsqueeze(-1).contiguous().view(torch.uint8), packed], -1)
    return BlockTensor("Q5_K", blocks_.reshape(rows, blocks, 28))


def q5_1_blocks(raw: Tensor) -> BlockTensor:
    """Q5_1 blocks uint8 [rows, n, 24] (d, m, qh, qs) -> Q5_K's form [rows, n, 28]."""
    dm = raw[..., 0:4].contiguous().view(torch.float16).float()
    return BlockTensor("Q5_K", torch.cat([fp32_bytes(dm), raw[..., 4:]], dim=-1))


def q4_0_blocks(raw: Tensor) -> BlockTensor:
    """Q4_0 blocks uint8 [rows, n, 18] (d, qs) -> Q4_1's form [rows, n, 20] with m = -8 d,
    exact in fp16: d * q + m = d * (q - 8)."""
    d = raw[..., 0:2].contiguous().view(torch.float16)
    m = (-8.0 * d.float()).to(torch.float16).view(torch.uint8)
    return BlockTensor("Q4_1", torch.cat([raw[..., 0:2], m, raw[..., 2:]], dim=-1))


def block_tensor(kind: str, data: Tensor) -> BlockTensor:
    """A GGUF tensor's bytes, [rows, bytes a row] (uint8, or the F16/BF16 values), in its
    kernel's form."""
    rows = data.shape[0]
    raw = data.contiguous().view(torch.uint8).reshape(rows, -1, RAW_BYTES[kind])
    convert = {"Q4_K": q4_k_blocks, "Q6_K": q6_k_blocks, "Q5_K": q5_k_blocks,
               "Q5_1": q5_1_blocks, "Q4_0": q4_0_blocks}.get(kind)
    if convert is None:
        return BlockTensor(kind, raw)
    first = convert(raw[:CHUNK_ROWS])  # in slices of rows: the temporaries stay small
    if rows <= CHUNK_ROWS:
        return first
    out = torch.empty(rows, *first.blocks.shape[1:], dtype=torch.uint8)
    out[:CHUNK_ROWS] = first.blocks
    for start in range(CHUNK_ROWS, rows, CHUNK_ROWS):
        out[start:start + CHUNK_ROWS] = convert(raw[start:start + CHUNK_ROWS]).blocks
    return BlockTensor(first.kind, out)


def fuse(parts: list[BlockTensor]) -> BlockTensor | None:
    """The parts stacked along rows where they share a form; None where they do not (each
    then runs on its own kernel)."""
    if len({p.kind for p in parts}) != 1:
        return None
    return BlockTensor.cat(parts)
