"""Qwen3 (dense): the Llama forward pass (model/llama.py) with an RMSNorm over each query
and each key head, applied after the projection and before RoPE (one weight of head_dim
for the queries, one for the keys). No biases. head_dim comes from the config, and need
not be hidden_size / num_heads (Qwen3-0.6B: 1024 / 16 heads, head_dim 128).

Sliding-window configs are refused by model/config.py, as for Qwen2. The head norms run in
PyTorch (model/layers.py QKNorm), between the fused QKV matmul and the fused RoPE.
"""

from __future__ import annotations

from torch import Tensor

from model import llama
from model.config import ModelConfig

Qwen3Model = llama.LlamaModel  # built with cfg.qk_norm set


def convert_hf_weights(hf: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Llama's mapping, plus each layer's query and key head norms."""
    ours = llama.convert_hf_weights(hf, cfg)
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.self_attn.", f"layers.{i}.self_attn.qk_norm."
        ours[dst + "q_weight"] = hf[src + "q_norm.weight"]
        ours[dst + "k_weight"] = hf[src + "k_norm.weight"]
    return ours
