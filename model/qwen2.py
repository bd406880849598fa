"""Qwen2 (and Qwen2.5): the Llama forward pass (model/llama.py) with a bias on each of the
query, key and value projections; the output projection and the MLP have none.

Qwen2 can also run some layers with sliding-window attention; model/config.py refuses
configs that turn it on (use_sliding_window true), as every layer here attends to the whole
context. The biases are added in PyTorch after the fused QKV matmul (model/layers.py
BiasedLinear), so the packed GEMM runs unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from model import llama
from model.config import ModelConfig

Qwen2Model = llama.LlamaModel  # built with cfg.qkv_bias set


def convert_hf_weights(hf: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Llama's mapping, plus the q, k and v biases fused in the order of the weights."""
    ours = llama.convert_hf_weights(hf, cfg)
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.self_attn.", f"layers.{i}.self_attn.qkv_proj."
        ours[dst + "linear.weight_t"] = ours.pop(dst + "weight_t")
        ours[dst + "bias"] = torch.cat([hf[src + "q_proj.bias"], hf[src + "k_proj.bias"],
                                        hf[src + "v_proj.bias"]])
    return ours
