"""Read a Llama GGUF file's quantized tensors as raw blocks, under Hugging Face's names.

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
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # the Llama reader's types (read_gguf_codes)
# Bytes per block of 32 in each kernel form: the GGUF's own for Q4_1, Q8_0, Q5_0, F16 and
# BF16; fp32 scales (and mins) per 32 for the K-quants' forms (model/gguf_codes.py).
FORM_BYTES = {"Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q4_K": 24, "Q5_K": 28, "Q6_K": 40,
              "F16": 64, "BF16": 64}


@dataclass
class BlockTensor:
    """A [rows, cols] matrix as raw blocks of 32 along the input dim: uint8 [rows, cols / 32,
    bytes per block] in one of our kernels' forms (FORM_BYTES; model/gguf_codes.py makes the
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


def rope_unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (transformers'
    `reverse_permute_weights`): our row (h, half, i) is GGUF row (h, i, half)."""
    head_dim = rows // num_heads
    gguf_rows = torch.arange(rows).reshape(num_heads, head_dim // 2, 2)
    return gguf_rows.transpose(1, 2).reshape(rows)


def read_gguf_block_tensor(path: str | Path, name: str) -> BlockTensor | None:
    """One tensor of a GGUF file as its raw blocks (a view of the memory map), or None where
    it is not Q4_1 or Q8_0."""
    from gguf import GGUFReader

    for t in GGUFReader(str(path)).tensors:
        if t.name == name and t.tensor_type.name in BLOCK_BYTES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "non-writable": we only read it
                data = torch.from_numpy(t.data)
            kind = t.tensor_type.name
            return BlockTensor(kind, data.reshape(data.shape[0], -1, BLOCK_BYTES[kind]))
    return None


@dataclass
class GGUFCodes:
    """A Llama GGUF's tensors under Hugging Face's names, as the file holds them: the
    matrices as raw blocks (Q/K rows un-permuted), the norms in fp32."""

    num_layers: int
    tensors: dict[str, BlockTensor | torch.Tensor]


def _field(reader, key: str) -> int:
    field = reader.fields[key]
    return int(field.parts[field.data[0]][0])


def read_gguf_codes(path: str | Path) -> GGUFCodes:
    """Every tensor, the quantized ones as views of the memory-mapped file (the Q and K rows
    reordered: copies)."""
    from gguf import GGUFReader

    from model.gguf_checkpoint import hf_name

    reader = GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"{path}: the GGUF's own codes are read for Llama models only, "
                         f"not {arch}")
    heads = {"attn_q": _field(reader, "llama.attention.head_count"),
             "attn_k": _field(reader, "llama.attention.head_count_kv")}
    tensors: dict[str, BlockTensor | torch.Tensor] = {}
    unexpected = []
    for t in reader.tensors:
        kind, name = t.tensor_type.name, hf_name(t.name, arch)
        if name is None:
            unexpected.append(t.name)
            continue
        # A view of the read-only memory map, not a copy: file pages, not heap, until packed.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable": we only read it
            data = torch.from_numpy(t.data)
        if kind in BLOCK_BYTES:
            weight = BlockTensor(kind, data.reshape(data.shape[0], -1, BLOCK_BYTES[kind]))
            role = t.name.split(".")[-2]
            if role in heads:
                weight = weight.take_rows(rope_unpermute_index(weight.rows, heads[role]))
            tensors[name] = weight
        elif kind == "F32":
            tensors[name] = data.clone()  # small; a view would keep the whole file mapped
        else:
            raise ValueError(f"{path}: tensor {t.name} is {kind}; only Q4_1, Q8_0 and F32 "
                             "are supported")
    if unexpected:
        raise ValueError(f"{path}: unexpected tensors {sorted(unexpected)}")
    return GGUFCodes(_field(reader, "llama.block_count"), tensors)


@dataclass
class GGUFModel:
    """The codes of a Llama GGUF under our module names (q/k/v and gate/up fused), as
    `--weights q4_1` installs them."""

    num_layers: int
    quantized: dict[str, BlockTensor]  # "layers.0.self_attn.qkv_proj", ..., "embed_tokens"
    dense: dict[str, torch.Tensor]  # fp32 norms: "layers.0.input_layernorm.weight", ...


class _CollectCodes:
    """The part of a weight format that model/checkpoint.py's walk calls, keeping each
    module's (fused) codes instead of building it."""

    def __init__(self) -> None:
        self.quantized: dict[str, BlockTensor] = {}

    def linear(self, name, module, weights, biases):
        self.quantized[name] = BlockTensor.cat(weights)
        return module

    def embedding_and_head(self, model, embedding, head) -> None:
        self.quantized["embed_tokens"] = embedding
        if head is not None:
            self.quantized["lm_head"] = head


def read_gguf(path: str | Path) -> GGUFModel:
    """A Llama GGUF's codes by our module names, fused by the same walk that loads them."""
    from model.checkpoint import Checkpoint, load_weights
    from model.gguf_checkpoint import open_gguf, read_config
    from model.registry import architecture

    path = Path(path)
    cfg = read_config(open_gguf(path), path)
    codes = read_gguf_codes(path)
    arch = architecture(cfg.model_type)
    with torch.device("meta"):
        model = arch.model_class(cfg)
    collect = _CollectCodes()
    load_weights(model, arch, Checkpoint(cfg, codes.tensors, path), collect)
    dense = {name: t for name, t in model.state_dict().items() if not t.is_meta}
    return GGUFModel(codes.num_layers, collect.quantized, dense)
