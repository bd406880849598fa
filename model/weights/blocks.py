"""A quantized matrix as raw blocks of 32 weights along its input dim, in one of our kernels'
forms: the type every weight format and the GGUF reading share (a leaf: it imports nothing of
ours).

The forms (model/gguf/codes.py makes them from a GGUF file's types; model/weights/quantized.py
packs them for the kernels):
- Q4_1, 20 bytes: fp16 d and m, 16 bytes of 4-bit codes (byte j: weight j low, j + 16 high);
  w = d * q + m.
- Q8_0, 34 bytes: fp16 d, 32 int8 codes; w = d * q.
- Q5_0, 22 bytes: fp16 d, the 32 fifth bits as a word, Q4_1's code bytes; w = d * (q - 16).
- Q5_K, 28 bytes: fp32 s and m, the fifth bits, the code bytes; w = s * q + m.
- F16, BF16, 64 bytes: the 32 values.
- Q4_K and Q6_K as the file has them, a unit of 256 weights (8 blocks): Q4_K 148 bytes (fp16
  d and dmin, 8 sub-scales, 8 sub-mins, 8 blocks of Q4_1's code bytes; w = d sc q - dmin mn),
  Q6_K 210 bytes (fp16 d, 16 int8 sub-scales, 8 blocks of low-nibble code bytes, 8 blocks of
  8 bytes of the high two bits; w = d sc (q - 32)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # weights per block
# Bytes per stored unit of each kernel form, and the weights a unit holds: a block of 32, or
# for Q4_K and Q6_K a super-block of 256 (model/gguf/codes.py makes them).
FORM_BYTES = {"Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q5_K": 28, "F16": 64, "BF16": 64,
              "Q4_K": 148, "Q6_K": 210}
UNIT_WEIGHTS = {kind: 256 if kind in ("Q4_K", "Q6_K") else BLOCK for kind in FORM_BYTES}


@dataclass
class BlockTensor:
    """A [rows, cols] matrix as raw units along the input dim: uint8 [rows, cols / unit
    weights, bytes per unit] in one of our kernels' forms (FORM_BYTES, UNIT_WEIGHTS;
    model/gguf/codes.py makes the forms of the GGUF types that are not one already)."""

    kind: str
    blocks: torch.Tensor

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    @property
    def cols(self) -> int:
        return self.blocks.shape[1] * UNIT_WEIGHTS[self.kind]

    def _fp32(self, start: int, count: int = 1) -> torch.Tensor:
        field = self.blocks[..., start:start + 4 * count].contiguous().view(torch.float32)
        return field.squeeze(-1) if count == 1 else field

    def scales(self) -> torch.Tensor:
        """d per block, fp32 [rows, cols / 32] (the forms stored in blocks of 32)."""
        if self.kind == "Q5_K":
            return self._fp32(0)
        return self.blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()

    def minimums(self) -> torch.Tensor:
        """m per block (Q4_1, Q5_K), fp32 [rows, cols / 32]."""
        if self.kind == "Q5_K":
            return self._fp32(4)
        assert self.kind == "Q4_1"
        return self.blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()

    def codes(self) -> torch.Tensor:
        """q per weight: [rows, cols / 32, 32], uint8 0..15 (Q4_1), 0..31 (Q5_K) or int8
        (Q8_0, Q5_0's q - 16)."""
        if self.kind == "Q8_0":
            return self.blocks[..., 2:].contiguous().view(torch.int8)
        start = {"Q4_1": 4, "Q5_0": 6, "Q5_K": 12}[self.kind]
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
        if self.kind in ("Q4_K", "Q6_K"):
            return super_block_weights(self.kind, self.blocks).reshape(self.rows, self.cols)
        q = self.codes().float()
        w = q * self.scales().unsqueeze(-1)
        if self.kind in ("Q4_1", "Q5_K"):
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


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """fp16 bytes [..., 2] -> fp32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def super_block_weights(kind: str, units: torch.Tensor) -> torch.Tensor:
    """Q4_K or Q6_K units uint8 [rows, n, bytes] -> fp32 weights [rows, n, 256], each as the
    GGUF reference computes it (every product exact in fp32, one rounding for Q4_K's min)."""
    rows, n = units.shape[:2]
    d = _halves(units[..., 0:2]).reshape(rows, n, 1, 1)
    if kind == "Q4_K":
        dmin = _halves(units[..., 2:4]).reshape(rows, n, 1, 1)
        sc, mn = (units[..., a:a + 8].float().reshape(rows, n, 8, 1) for a in (4, 12))
        packed = units[..., 20:].reshape(rows, n, 8, 16)
        q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()  # [rows, n, 8, 32]
        return ((d * sc) * q - dmin * mn).reshape(rows, n, 256)
    sc = units[..., 2:18].contiguous().view(torch.int8).float().reshape(rows, n, 8, 2, 1)
    ql = units[..., 18:146].reshape(rows, n, 8, 16)
    qh = units[..., 146:].reshape(rows, n, 8, 8).to(torch.int32)
    high = torch.cat([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], dim=-1)  # weight order
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-1).to(torch.int32)
    q = ((low | (high << 4)) - 32).float().reshape(rows, n, 8, 2, 16)
    return ((d.unsqueeze(-1) * sc) * q).reshape(rows, n, 256)
