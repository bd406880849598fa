"""Qwen3 (dense): the Llama forward pass (model/llama.py) with an RMSNorm over each query
and each key head, applied after the projection and before RoPE (one weight of head_dim
for the queries, one for the keys). No biases. head_dim comes from the config, and need
not be hidden_size / num_heads (Qwen3-0.6B: 1024 / 16 heads, head_dim 128).

Sliding-window configs are refused by model/config.py, as for Qwen2. The head norms run in
PyTorch (model/layers.py QKNorm), between the fused QKV matmul and the fused RoPE.
"""

from __future__ import annotations

from model import llama

Qwen3Model = llama.LlamaModel  # built with cfg.qk_norm set


# Llama's, plus the query and key head norms (q_norm, k_norm) as one QKNorm.
PACKED_MODULES = {**llama.PACKED_MODULES, "qk_norm": ("q_norm", "k_norm")}
