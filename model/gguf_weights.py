"""Read a Llama GGUF file's quantized tensors as raw blocks, under our layer names.

Two block formats matter for the default model (llama.cpp's ggml-common.h):
- Q4_1, 20 bytes per 32 weights along the input dim: fp16 scale d, fp16 minimum m, then 16
  bytes of 4-bit codes; byte j holds weight j in its low nibble and weight j + 16 in its high
  one. w = d * q + m.
- Q8_0, 34 bytes per 32 weights: fp16 scale d, then 32 int8 codes. w = d * q.

In fp32, d * q is exact (11 + 4 or 8 significant bits), so the dequantized weights are one
rounding of d * q + m: exactly what transformers' GGUF loader (gguf's numpy code) produced for
the prepared fp32 folder.

llama.cpp's converter permutes the rows of Q and K for its own RoPE layout (interleaved pairs
instead of rotate-half halves); transformers permutes them back. Rows are output features and
blocks run along the input dim, so the inverse is a reordering of whole rows of blocks, done on
the codes here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

BLOCK = 32  # weights per block, both formats
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


@dataclass
class BlockTensor:
    """A quantized [rows, cols] matrix as raw blocks: uint8 [rows, cols / 32, bytes per block]."""

    kind: str  # "Q4_1" or "Q8_0"
    blocks: torch.Tensor

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    @property
    def cols(self) -> int:
        return self.blocks.shape[1] * BLOCK

    def scales(self) -> torch.Tensor:
        """d per block, fp32 [rows, cols / 32]."""
        return self.blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()

    def minimums(self) -> torch.Tensor:
        """m per block (Q4_1 only), fp32 [rows, cols / 32]."""
        assert self.kind == "Q4_1"
        return self.blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()

    def codes(self) -> torch.Tensor:
        """q per weight: [rows, cols / 32, 32], uint8 0..15 (Q4_1) or int8 (Q8_0)."""
        if self.kind == "Q8_0":
            return self.blocks[..., 2:].contiguous().view(torch.int8)
        packed = self.blocks[..., 4:]
        return torch.cat([packed & 0x0F, packed >> 4], dim=-1)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weights [rows, cols], computed as gguf's reference code does."""
        q = self.codes().float()
        w = q * self.scales().unsqueeze(-1)
        if self.kind == "Q4_1":
            w = w + self.minimums().unsqueeze(-1)
        return w.reshape(self.rows, self.cols)

    def take_rows(self, index: torch.Tensor) -> BlockTensor:
        return BlockTensor(self.kind, self.blocks[index])

    @staticmethod
    def cat(parts: list[BlockTensor]) -> BlockTensor:
        """Stack along rows (output features): q, k, v -> qkv; gate, up -> gate_up."""
        assert len({p.kind for p in parts}) == 1
        return BlockTensor(parts[0].kind, torch.cat([p.blocks for p in parts]))


def rope_unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (transformers'
    `reverse_permute_weights`): our row (h, half, i) is GGUF row (h, i, half)."""
    head_dim = rows // num_heads
    gguf_rows = torch.arange(rows).reshape(num_heads, head_dim // 2, 2)
    return gguf_rows.transpose(1, 2).reshape(rows)


@dataclass
class GGUFModel:
    """The tensors of a Llama GGUF, named as our model names its layers."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    quantized: dict[str, BlockTensor]  # "layers.0.self_attn.qkv_proj", ..., "embed_tokens"
    dense: dict[str, torch.Tensor]  # fp32 norms: "layers.0.input_layernorm.weight", ...


def _field(reader, key: str) -> int:
    field = reader.fields[key]
    return int(field.parts[field.data[0]][0])


def read_gguf(path: str | Path) -> GGUFModel:
    """Every tensor, the quantized ones as views of the memory-mapped file; Q/K/V and
    gate/up fused (copies)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    num_layers = _field(reader, "llama.block_count")
    num_heads = _field(reader, "llama.attention.head_count")
    num_kv_heads = _field(reader, "llama.attention.head_count_kv")
    raw: dict[str, BlockTensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        # A view of the read-only memory map, not a copy: file pages, not heap, until packed.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable": we only read it
            data = torch.from_numpy(t.data)
        if kind in BLOCK_BYTES:
            raw[t.name] = BlockTensor(kind, data.reshape(data.shape[0], -1, BLOCK_BYTES[kind]))
        elif kind == "F32":
            dense[t.name] = data.clone()  # small; a view would keep the whole file mapped
        else:
            raise ValueError(f"{path}: tensor {t.name} is {kind}; only Q4_1, Q8_0 and F32 "
                             "are supported")

    def take(name: str) -> BlockTensor:
        if name not in raw:
            raise ValueError(f"{path}: no quantized tensor {name}")
        return raw.pop(name)

    quantized = {"embed_tokens": take("token_embd.weight")}
    if "output.weight" in raw:  # an untied LM head
        quantized["lm_head"] = take("output.weight")
    ours_dense = {"norm.weight": dense.pop("output_norm.weight")}
    for i in range(num_layers):
        blk, dst = f"blk.{i}.", f"layers.{i}."
        q, k = take(blk + "attn_q.weight"), take(blk + "attn_k.weight")
        q = q.take_rows(rope_unpermute_index(q.rows, num_heads))
        k = k.take_rows(rope_unpermute_index(k.rows, num_kv_heads))
        quantized[dst + "self_attn.qkv_proj"] = BlockTensor.cat([q, k, take(blk + "attn_v.weight")])
        quantized[dst + "self_attn.o_proj"] = take(blk + "attn_output.weight")
        quantized[dst + "mlp.gate_up_proj"] = BlockTensor.cat(
            [take(blk + "ffn_gate.weight"), take(blk + "ffn_up.weight")])
        quantized[dst + "mlp.down_proj"] = take(blk + "ffn_down.weight")
        ours_dense[dst + "input_layernorm.weight"] = dense.pop(blk + "attn_norm.weight")
        ours_dense[dst + "post_attention_layernorm.weight"] = dense.pop(blk + "ffn_norm.weight")
    if raw or dense:
        raise ValueError(f"{path}: unexpected tensors {sorted(raw) + sorted(dense)}")
    return GGUFModel(num_layers, num_heads, num_kv_heads, quantized, ours_dense)
