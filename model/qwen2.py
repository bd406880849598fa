"""Qwen2 (and Qwen2.5): the Llama forward pass (model/llama.py) with a bias on each of the
query, key and value projections; the output projection and the MLP have none.

Qwen2 can also run some layers with sliding-window attention; model/config.py refuses
configs that turn it on (use_sliding_window true), as every layer here attends to the whole
context. The biases are added in PyTorch after the fused QKV matmul (model/layers.py
BiasedLinear), so the packed GEMM runs unchanged.
"""

from __future__ import annotations

from model import llama

Qwen2Model = llama.LlamaModel  # built with cfg.qkv_bias set


# The biases come with the fused q/k/v: BiasedLinear takes q_proj's, k_proj's and v_proj's in
# the order of the weights (model/checkpoint.py).
PACKED_MODULES = llama.PACKED_MODULES
