"""The model's shape, read from a Hugging Face `config.json`.

Which `model_type`s are read, and what each may hold, is decided here: a config asking for
something the forward pass does not compute (a rope type, biases, a sliding window) is
refused at load with the reason, never served with different math.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# model_type -> what its attention adds to Llama's: biases on q, k and v (Qwen2), an RMSNorm
# of each query and key head before RoPE (Qwen3).
ARCHITECTURE_FEATURES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
}
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rope scaling: frequencies whose wavelength outgrows the original context
    are divided by `factor`, short ones kept, and the band between blended (layers.py)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    model_type: str = "llama"
    rope_scaling: Llama3RopeScaling | None = None
    qkv_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "llama")
        if model_type not in ARCHITECTURE_FEATURES:
            raise ValueError(f"model_type {model_type!r} is not supported; this server runs: "
                             f"{', '.join(sorted(ARCHITECTURE_FEATURES))}")
        check_architecture(model_type, raw)
        rope_theta, rope_scaling = read_rope(raw)
        eos = raw.get("eos_token_id", [])
        eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
        hidden = raw["hidden_size"]
        heads = raw["num_attention_heads"]
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=rope_theta,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            eos_token_ids=tuple(i for i in eos_ids if i is not None),
            model_type=model_type,
            rope_scaling=rope_scaling,
            **ARCHITECTURE_FEATURES[model_type],
        )


def check_architecture(model_type: str, raw: dict[str, Any]) -> None:
    """Refuse what this model_type's config may ask for but the forward pass lacks."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"only SiLU MLPs are supported, got {raw['hidden_act']}")
    if raw.get("mlp_bias"):
        raise ValueError("MLP biases are not supported")
    # Llama and Qwen3 have an attention_bias switch (q, k, v and o together); Qwen2's q, k and
    # v biases are always there and its o has none, whatever the config says.
    if model_type != "qwen2" and raw.get("attention_bias"):
        raise ValueError(f"{model_type} with attention_bias true (biases on q, k, v and o) is "
                         "not supported")
    if model_type in ("qwen2", "qwen3"):
        layer_types = raw.get("layer_types") or []
        sliding = [i for i, kind in enumerate(layer_types) if kind != "full_attention"]
        reason = ("use_sliding_window is true" if raw.get("use_sliding_window") else
                  f"layer_types has layers {sliding} not full_attention" if sliding else None)
        if reason:
            raise ValueError(f"{model_type} with sliding-window attention ({reason}) is not "
                             "supported: every layer here attends to the whole context")


def read_rope(raw: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE's theta and scaling. transformers 5 writes both under `rope_parameters`; older
    folders keep `rope_theta` at the top level and the scaling under `rope_scaling`."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported; supported rope types: "
                         f"{', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    return theta, Llama3RopeScaling(
        factor=rope["factor"], low_freq_factor=rope["low_freq_factor"],
        high_freq_factor=rope["high_freq_factor"],
        original_max_position_embeddings=rope["original_max_position_embeddings"])
