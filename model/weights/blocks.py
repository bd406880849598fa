"""A quantized matrix as raw blocks of 32 weights along its input dim, in one of our kernels'
forms: the type every weight format and the GGUF reading share (a leaf: it imports nothing of
ours).

The forms (model/gguf/codes.py makes them from a GGUF file's types; model/weights/quantized.py
packs them for the kernels):
- Q4_1, 20 bytes: fp16 d and m, 16 bytes of 4-bit codes (byte j: weight j low, j + 16 high);
  w = d * q + m.
- Q8_0, 34 bytes: fp16 d, 32 int8 codes; w = d * q.
- Q5_0, 22 bytes: fp16 d, the 32 fifth bits as a word, Q4_1's code bytes; w = d * (q - 16).
- Q4_K, 24 bytes: fp32 s and m, Q4_1's code bytes; w = s * q + m.
- Q5_K, 28 bytes: fp32 s and m, the fifth bits, the code bytes; w = s * q + m.
- Q6_K, 40 bytes: fp32 s0 and s1 (weights 0-15, 16-31), 32 int8 codes q - 32.
- F16, BF16, 64 bytes: the 32 values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # weights per block
# Bytes per block of 32 in each kernel form: the GGUF's own for Q4_1, Q8_0, Q5_0, F16 and
# BF16; fp32 scales (and mins) per 32 for the K-quants' forms (model/gguf/codes.py).
FORM_BYTES = {"Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q4_K": 24, "Q5_K": 28, "Q6_K": 40,
              "F16": 64, "BF16": 64}


@dataclass
class BlockTensor:
    """A [rows, cols] matrix as raw blocks of 32 along the input dim: uint8 [rows, cols / 32,
    bytes per block] in one of our kernels' forms (FORM_BYTES; model/gguf/codes.py makes the
    forms of the GGUF types that are not one already)."""

    kind: str
    blocks: torch.Tensor

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    @property
    def cols(self) -> int:
        return self.blocks.shape[1] * BLOCK

    def _fp32(self, start: int, count: int = 1) -> torch.Tensor:
        field = self.blocks[..., start:start + 4 * count].contiguous().view(torch.float32)
        return field.squeeze(-1) if count == 1 else field

    def scales(self) -> torch.Tensor:
        """d per block, fp32 [rows, cols / 32] (Q6_K's form: [rows, cols / 32, 2], one per
        16 weights)."""
        if self.kind in ("Q4_K", "Q5_K", "Q6_K"):
            return self._fp32(0, 2 if self.kind == "Q6_K" else 1)
        return self.blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()

    def minimums(self) -> torch.Tensor:
        """m per block (Q4_1, Q4_K, Q5_K), fp32 [rows, cols / 32]."""
        if self.kind in ("Q4_K", "Q5_K"):
            return self._fp32(4)
        assert self.kind == "Q4_1"
        return self.blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()

    def codes(self) -> torch.Tensor:
        """q per weight: [rows, cols / 32, 32], uint8 0..15 (Q4_1, Q4_K), 0..31 (Q5_K) or
        int8 (Q8_0, Q6_K's q - 32, Q5_0's q - 16)."""
        if self.kind in ("Q8_0", "Q6_K"):
            return self.blocks[..., 2 if self.kind == "Q8_0" else 8:].contiguous().view(
                torch.int8)
        start = {"Q4_1": 4, "Q4_K": 8, "Q5_0": 6, "Q5_K": 12}[self.kind]
        packed = self.blocks[..., start:]
        q = torch.cat([packed & 0x0F, packed >> 4], dim=-1)
        if self.kind not in ("Q5_0", "Q5_K"):
            return q
        high = self.blocks[..., start - 4:start].contiguous().view(torch.int32)  # bit i: 5th
        bits = (high >> torch.arange(BLOCK, dtype=torch.int32)) & 1
        q = q.to(torch.int32) | (bits << 4)
        return (q - 16).to(torch.int8) if self.kind == "Q5_0" else q.to(torch.uint8)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weights [rows, cols], computed as gguf's reference code does."""
        if self.kind in ("F16", "BF16"):
            dtype = torch.float16 if self.kind == "F16" else torch.bfloat16
            return self.blocks.contiguous().view(dtype).float().reshape(self.rows, self.cols)
        q = self.codes().float()
        if self.kind == "Q6_K":  # a scale per 16 weights
            w = (q.unflatten(-1, (2, 16)) * self.scales().unsqueeze(-1)).flatten(-2)
        else:
            w = q * self.scales().unsqueeze(-1)
        if self.kind in ("Q4_1", "Q4_K", "Q5_K"):
            w = w + self.minimums().unsqueeze(-1)
        return w.reshape(self.rows, self.cols)

    def take_rows(self, index: torch.Tensor) -> BlockTensor:
        return BlockTensor(self.kind, self.blocks[index])

    @staticmethod
    def cat(parts: list[BlockTensor]) -> BlockTensor:
        """Stack along rows (output features): q, k, v -> qkv; gate, up -> gate_up."""
        if len({p.kind for p in parts}) != 1:
            raise ValueError(f"cannot fuse {[p.kind for p in parts]} blocks into one matrix")
        if len(parts) == 1:
            return parts[0]
        return BlockTensor(parts[0].kind, torch.cat([p.blocks for p in parts]))
