"""Load a GGUF file as a checkpoint of any architecture here: its config from the metadata,
its tensors dequantized to fp32 (by the `gguf` package's reference code, as transformers
does) under Hugging Face's names, a checkpoint for model/checkpoint.py's walk.

Everything that could fail is checked before a tensor is dequantized: from the header alone
(model/gguf/header.py), every tensor's type and that its bytes lie inside the file (a
truncated download is refused by name, not read past its end); then the architecture and
the shape fields.

Two things llama.cpp's converter changes, undone here as transformers' GGUF loader does:
- Llama-type models: the rows of Q and K are permuted for llama.cpp's interleaved RoPE
  (`rope_unpermute_index` below undoes it). Qwen2, Qwen3 and Gemma 3 use
  rotate-half RoPE in llama.cpp too, so theirs are stored as they are.
- Gemma 3: every norm weight is stored with its + 1 added (llama.cpp multiplies by it
  directly); Hugging Face's (and our) Gemma norms multiply by (1 + weight), so 1 is taken off.

Gemma 3's sliding-window pattern, local RoPE base and attention scale are not all in the
metadata: llama.cpp fixes them per architecture (every 6th layer full, local base 10 000,
queries scaled by head_dim ** -0.5), and so do we, reading the pattern where a file has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.config import ModelConfig
from model.gguf.header import HeaderError, read_tensor_extents
from model.weights.blocks import BlockTensor

# general.architecture -> our model_type
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma3": "gemma3_text"}
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                "Q6_K")

# GGUF tensor names (within blk.N.) -> Hugging Face's (within model.layers.N.)
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Gemma's four norms a layer: its ffn_norm is the norm before the MLP.
GEMMA_LAYER_TENSORS = {**LAYER_TENSORS, "ffn_norm": "pre_feedforward_layernorm",
                       "post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm"}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                  "output": "lm_head"}


def rope_unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (transformers'
    `reverse_permute_weights`): our row (h, half, i) is GGUF row (h, i, half)."""
    head_dim = rows // num_heads
    gguf_rows = torch.arange(rows).reshape(num_heads, head_dim // 2, 2)
    return gguf_rows.transpose(1, 2).reshape(rows)


class GGUFError(ValueError):
    """A GGUF file this server cannot load; the message names the file and the reason."""


@dataclass
class GGUFCheckpoint:
    config: ModelConfig
    hf_weights: dict[str, torch.Tensor | BlockTensor]  # fp32 (or codes), Hugging Face names
    tensor_types: dict[str, str]  # the file's type of each, by the same names


def open_gguf(path: Path):
    """The GGUFReader of a file whose header has been checked against its size."""
    from gguf import GGUFReader

    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    check_tensor_bytes(path)
    try:
        return GGUFReader(str(path))
    except Exception as exc:  # checked above; anything left is damage inside the metadata
        raise GGUFError(f"{path}: not a readable GGUF file (corrupt?): "
                        f"{type(exc).__name__}: {exc}") from exc


def check_tensor_bytes(path: Path) -> None:
    """From the header alone: every tensor of a supported type, whole blocks, and its bytes
    inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        extents, size = read_tensor_extents(path)
    except HeaderError as exc:
        raise GGUFError(f"{path}: not a readable GGUF file (truncated or corrupt): "
                        f"{exc}") from exc
    for t in extents:
        try:
            kind = GGMLQuantizationType(t.type_id).name
        except ValueError:
            kind = f"type id {t.type_id}"
        if kind not in TENSOR_TYPES:
            raise GGUFError(f"{path}: tensor {t.name} is {kind}; supported tensor types: "
                            f"{', '.join(TENSOR_TYPES)}")
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        count = int(np.prod(t.dims))
        end = t.start + count // block * block_bytes
        if count % block or end > size:
            raise GGUFError(f"{path}: tensor {t.name} ({kind}, shape {list(t.dims)}) needs "
                            f"bytes {t.start}..{end}, but the file has {size}: truncated or "
                            "corrupt")


def field(reader, key: str, default: Any = None) -> Any:
    if key not in reader.fields:
        return default
    return reader.fields[key].contents()


def read_config(reader, path: Path) -> ModelConfig:
    """The metadata as a Hugging Face config.json would say it, read by ModelConfig (which
    refuses what the forward pass does not compute)."""
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise GGUFError(f"{path}: GGUF architecture {arch!r} is not supported; supported: "
                        f"{', '.join(sorted(GGUF_ARCHITECTURES))}")
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise GGUFError(f"{path}: no token_embd.weight tensor")

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise GGUFError(f"{path}: metadata {arch}.{key} is missing")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // heads))
    value_dim = int(field(reader, f"{arch}.attention.value_length", head_dim))
    rotary_dim = int(field(reader, f"{arch}.rope.dimension_count", head_dim))
    if value_dim != head_dim or rotary_dim != head_dim:
        raise GGUFError(f"{path}: key length {head_dim}, value length {value_dim} and RoPE "
                        f"dimensions {rotary_dim} differ; only full-width RoPE over equal "
                        "K and V heads is supported")
    raw: dict[str, Any] = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "vocab_size": int(names["token_embd.weight"].shape[1]),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
    }
    scaling = field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raw["rope_scaling"] = {"rope_type": scaling,
                               "factor": field(reader, f"{arch}.rope.scaling.factor")}
    if arch == "gemma3":
        raw.update(gemma3_fields(reader, raw))
    try:
        return ModelConfig.from_dict(raw)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from exc


def gemma3_fields(reader, raw: dict[str, Any]) -> dict[str, Any]:
    """What Gemma 3 adds to the config, with llama.cpp's fixed values where a file has none."""
    extra: dict[str, Any] = {
        "sliding_window": field(reader, "gemma3.attention.sliding_window"),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": raw["head_dim"],
        "final_logit_softcapping": field(reader, "gemma3.final_logit_softcapping"),
        "attn_logit_softcapping": field(reader, "gemma3.attn_logit_softcapping"),
    }
    pattern = field(reader, "gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # one flag a layer, true where it slides
        extra["layer_types"] = ["sliding_attention" if flag else "full_attention"
                                for flag in pattern]
    else:
        extra["sliding_window_pattern"] = int(pattern)
    return extra


def hf_name(gguf_name: str, arch: str) -> str | None:
    """Hugging Face's name for a GGUF tensor, or None if it is not one we load."""
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if stem in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[stem]}.{suffix}"
    parts = stem.split(".")
    table = GEMMA_LAYER_TENSORS if arch == "gemma3" else LAYER_TENSORS
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in table:
        return f"model.layers.{parts[1]}.{table[parts[2]]}.{suffix}"
    return None


def dequantize(tensor) -> torch.Tensor:
    """One tensor as fp32, shaped [rows, cols] (GGUF lists the dimensions the other way)."""
    from gguf import quants

    values = quants.dequantize(tensor.data, tensor.tensor_type)
    shape = [int(d) for d in reversed(tensor.shape)]
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


class LazyTensors(dict):
    """Hugging Face name -> tensor, each read (and converted) from the file when first looked
    up, then its pages of the file let go: a load holds one tensor's temporaries at a time,
    never the whole file twice. Values are the functions that make them until then."""

    def __getitem__(self, name: str):
        value = super().__getitem__(name)
        if callable(value):
            value = value()
            super().__setitem__(name, value)
        return value

    def pop(self, name: str, *default):
        if name not in self:
            if default:
                return default[0]
            raise KeyError(name)
        value = self[name]
        super().__delitem__(name)
        return value


def read_gguf_checkpoint(path: str | Path, keep_codes: tuple[str, ...] = ()) -> GGUFCheckpoint:
    """Config and fp32 Hugging Face-named weights of a GGUF file; matrices of the types in
    `keep_codes` stay in their codes instead, in our kernels' form (model/gguf/codes.py).
    The weights are read as the load takes them (`LazyTensors`)."""
    path = Path(path)
    reader = open_gguf(path)
    cfg = read_config(reader, path)
    arch = field(reader, "general.architecture")
    unknown = [t.name for t in reader.tensors if hf_name(t.name, arch) is None]
    if unknown:
        raise GGUFError(f"{path}: tensors this server does not load: {', '.join(unknown[:8])}"
                        + (" ..." if len(unknown) > 8 else ""))
    weights = LazyTensors()
    types: dict[str, str] = {}
    for t in reader.tensors:
        name = hf_name(t.name, arch)
        assert name is not None
        types[name] = t.tensor_type.name
        weights[name] = partial(read_tensor, reader, t, arch, cfg, keeps_codes(t, keep_codes))
    return GGUFCheckpoint(cfg, weights, types)


def read_tensor(reader, t, arch: str, cfg: ModelConfig,
                codes: bool) -> torch.Tensor | BlockTensor:
    """One tensor as our model takes it: its codes in a kernel's form (a copy, not a view of
    the file) or dequantized to fp32, Llama's Q/K rows put back in order, Gemma's norms less
    their + 1. The file's pages it was read from are then let go."""
    w = read_codes(t) if codes else dequantize(t)
    if isinstance(w, BlockTensor) and w.kind in ("Q4_1", "Q8_0", "Q5_0", "F16", "BF16"):
        w = BlockTensor(w.kind, w.blocks.clone())  # kept as the file has them: copy
    if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg.num_heads if "attn_q" in t.name else cfg.num_kv_heads
        index = rope_unpermute_index(w.shape[0] if isinstance(w, torch.Tensor) else w.rows,
                                     heads)
        w = w[index] if isinstance(w, torch.Tensor) else w.take_rows(index)
    if arch == "gemma3" and t.name.endswith("norm.weight"):
        w = w - 1.0
    release_pages(reader, t)
    return w


def release_pages(reader, t) -> None:
    """Drop a tensor's pages of the memory-mapped file from this process (they stay in the
    page cache): touched file pages count in RSS while mapped."""
    import mmap

    area = getattr(reader.data, "_mmap", None)
    if area is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    page = mmap.PAGESIZE
    start = int(t.data_offset) // page * page
    end = min(len(area), -(-(int(t.data_offset) + int(t.n_bytes)) // page) * page)
    if end > start:
        area.madvise(mmap.MADV_DONTNEED, start, end - start)


def keeps_codes(tensor, keep_codes: tuple[str, ...]) -> bool:
    """A matrix of a kept type in whole blocks of 32 (F16 and BF16 may have any width)."""
    return (tensor.tensor_type.name in keep_codes and len(tensor.shape) == 2
            and int(tensor.shape[0]) % 32 == 0)


def read_codes(tensor) -> BlockTensor:
    """A quantized tensor's blocks (a view of the memory map, or their kernel form)."""
    import warnings

    from model.gguf.codes import block_tensor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable": we only read it
        data = torch.from_numpy(tensor.data)
    return block_tensor(tensor.tensor_type.name, data.reshape(data.shape[0], -1))
