"""The model's shape, read from a Hugging Face `config.json`.

Which `model_type`s are read, and what each may hold, is decided here: a config asking for
something the forward pass does not compute (a rope type, biases, a sliding window where
the architecture has none) is refused at load with the reason, never served with different
math. Gemma 3's own fields (sliding windows, two RoPE bases, its attention scale) are read by
`read_gemma3`.
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
    "gemma3_text": {"qkv_bias": False, "qk_norm": True},
}
GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")
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
    # Gemma 3: which layers attend only to the last `sliding_window` tokens (a query sees
    # itself and the window - 1 tokens before it), the RoPE base of those layers, the
    # attention's 1/sqrt scale (query_pre_attn_scalar, not head_dim) and a tanh cap on the
    # final logits.
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    # An encoder (EmbeddingGemma): every token attends to every other in its sequence, a
    # sliding layer to those within window // 2 either side; no LM head (model/embedding.py).
    bidirectional: bool = False

    def layer_window(self, layer_idx: int) -> int | None:
        """The window of this layer's attention, None where it sees the whole context."""
        if self.sliding_layers and self.sliding_layers[layer_idx]:
            return self.sliding_window
        return None

    def layer_windows(self) -> list[int | None]:
        """layer_window of every layer, in order."""
        return [self.layer_window(i) for i in range(self.num_layers)]

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
        gemma3 = read_gemma3(raw) if model_type == "gemma3_text" else {}
        rope_theta, rope_scaling = (gemma3.pop("rope_theta"), None) if gemma3 else read_rope(raw)
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
            **gemma3,
        )


def check_architecture(model_type: str, raw: dict[str, Any]) -> None:
    """Refuse what this model_type's config may ask for but the forward pass lacks."""
    if model_type == "gemma3_text":
        check_gemma3(raw)
        return
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


def check_gemma3(raw: dict[str, Any]) -> None:
    """What a Gemma 3 config may switch on that the forward pass (model/gemma3.py) lacks."""
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"gemma3_text with hidden_activation {activation!r} is not supported: "
                         "the MLP is tanh-approximated GELU (gelu_pytorch_tanh)")
    refused = {
        "attention_bias": "biases on q, k, v and o",
        "attn_logit_softcapping": "a tanh cap on the attention scores",
    }
    for key, what in refused.items():
        if raw.get(key):
            raise ValueError(f"gemma3_text with {key}={raw[key]!r} ({what}) is not supported")


def read_gemma3(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's fields of ModelConfig. Layer kinds come from layer_types, else from
    sliding_window_pattern (every n-th layer full, the rest sliding; default 6). The two RoPE
    bases come from transformers 5's per-kind rope_parameters, else from rope_theta and
    rope_local_base_freq; both must be plain RoPE."""
    layers = raw["num_hidden_layers"]
    kinds = raw.get("layer_types")
    if not kinds:
        pattern = raw.get("sliding_window_pattern") or 6
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(layers)]
    unknown = sorted(set(kinds) - set(GEMMA3_LAYER_TYPES))
    if unknown or len(kinds) != layers:
        raise ValueError(f"gemma3_text layer_types must name {layers} layers, each one of "
                         f"{', '.join(GEMMA3_LAYER_TYPES)}; got {kinds}")
    window = raw.get("sliding_window")
    sliding = tuple(kind == "sliding_attention" for kind in kinds)
    if any(sliding) and not (isinstance(window, int) and window > 0):
        raise ValueError(f"gemma3_text has sliding layers but sliding_window is {window!r}")
    rope = raw.get("rope_parameters") or {}
    if raw.get("rope_scaling"):
        rope = {**rope, "full_attention": {**rope.get("full_attention", {}),
                                           **raw["rope_scaling"]}}
    bases = {"full_attention": raw.get("rope_theta", 1_000_000.0),
             "sliding_attention": raw.get("rope_local_base_freq", 10_000.0)}
    for kind, params in rope.items():
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"gemma3_text {kind} rope type {rope_type!r} is not supported; "
                             "supported rope types: default")
        bases[kind] = params.get("rope_theta", bases[kind])
    return {
        "rope_theta": float(bases["full_attention"]),
        "rope_local_theta": float(bases["sliding_attention"]),
        "sliding_window": window if any(sliding) else None,
        "sliding_layers": sliding,
        "query_pre_attn_scalar": float(raw.get("query_pre_attn_scalar", 256)),
        "final_logit_softcapping": raw.get("final_logit_softcapping"),
        "bidirectional": bool(raw.get("use_bidirectional_attention")),
    }
