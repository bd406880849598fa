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

from model.gguf.checkpoint import hf_name, rope_unpermute_index
from model.weights.blocks import BlockTensor

BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}  # the Llama reader's types (read_gguf_codes)


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
    from model.gguf.checkpoint import open_gguf, read_config
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
