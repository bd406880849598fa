"""The model's shape, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        # transformers 5 nests rope settings under rope_parameters; older folders keep rope_theta
        # at the top level.
        rope = raw.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", "default")
        if raw.get("rope_scaling") or rope_type != "default":
            raise ValueError(f"rope scaling ({rope_type}) is not supported")
        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise ValueError("models with attention or MLP biases are not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"only SiLU MLPs are supported, got {raw['hidden_act']}")
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
            num_kv_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=rope.get("rope_theta", raw.get("rope_theta", 10000.0)),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            eos_token_ids=tuple(i for i in eos_ids if i is not None),
            model_type=raw.get("model_type", "llama"),
        )
