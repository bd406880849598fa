"""The Llama-architecture forward pass in plain PyTorch (SmolLM2, Llama 3), which Qwen2 and
Qwen3 share (model/qwen2.py, model/qwen3.py say what they change).

Reads top to bottom like the architecture: token embedding, then per layer
RMSNorm -> grouped-query attention with RoPE -> residual, RMSNorm -> SwiGLU
MLP -> residual; a final RMSNorm and the LM head (tied to the embedding, or not).
The config switches on the two attention variants: biases on q, k and v (Qwen2) and an
RMSNorm of each query and key head before RoPE (Qwen3); a Llama model builds neither.

Two fusions, both exact: Q, K and V come from one matmul (`qkv_proj`), gate and
up from another (`gate_up_proj`). Fewer, larger matmuls mean fewer Python-level
ops per layer, which matters at small batch sizes on a CPU. Weights are stored
transposed ([in, out], see `Linear`), the layout the CPU's GEMM runs fastest
for the few rows of a decode step.

The model does not own a KV cache. Each layer hands its (q, k, v) to an
`attention` callable supplied by the caller: the paged cache of the engine
(model/attention/), a per-user cache (baseline_server.py), or plain causal
attention over the input (`causal_attention` in model/layers.py).

`PACKED_MODULES` says which Hugging Face modules our fused ones are made of (q/k/v, gate/up);
model/checkpoint.py loads a checkpoint with it, model/registry.py finds the architecture by
the config's `model_type`.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import (
    AttentionFn,
    BiasedLinear,
    FusedOps,
    Linear,
    QKNorm,
    RMSNorm,
    RotaryEmbedding,
    causal_attention,
)

__all__ = ["PACKED_MODULES", "AttentionFn", "LlamaModel", "RotaryEmbedding",
           "causal_attention"]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        qkv_size = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        qkv_class = BiasedLinear if cfg.qkv_bias else Linear
        self.qkv_proj = qkv_class(cfg.hidden_size, qkv_size)
        self.qk_norm = (QKNorm(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
                        if cfg.qk_norm else None)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        self.fused: FusedOps | None = None  # see model/layers.py use_fused_ops

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionFn) -> Tensor:
        kv_size = self.num_kv_heads * self.head_dim
        qk, v = self.qkv_proj(x).split([self.num_heads * self.head_dim + kv_size, kv_size], dim=-1)
        if self.qk_norm is not None:  # Qwen3: each query and key head normalized first
            qk = self.qk_norm(qk.unflatten(-1, (-1, self.head_dim))).flatten(-2)
        # RoPE rotates queries and keys alike, so rotate them in one go.
        if self.fused is not None:  # in place, in the QKV output
            cos, sin = (t.reshape(-1, self.head_dim) for t in rope)
            self.fused.rope_inplace(qk.reshape(-1, qk.shape[-1]), qk.shape[-1] // self.head_dim,
                                    cos, sin)
            qk = qk.unflatten(-1, (-1, self.head_dim))
        else:
            qk = RotaryEmbedding.apply(qk.unflatten(-1, (-1, self.head_dim)), *rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=-2)
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        out = attention(self.layer_idx, q, k, v)
        return self.o_proj(out.flatten(-2))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up in one matmul."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.fused: FusedOps | None = None  # see model/layers.py use_fused_ops

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)
        if self.fused is not None:
            rows = gate_up.reshape(-1, gate_up.shape[-1])
            return self.down_proj(self.fused.silu_mul(rows).view(*x.shape[:-1], -1))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, residual: Tensor | None, rope: tuple[Tensor, Tensor],
                attention: AttentionFn) -> tuple[Tensor, Tensor]:
        """x is the previous block's output, not yet added to the residual stream: each
        norm does that add first (RMSNorm's residual form). The first layer has no residual
        yet: x is the embedding, and the stream starts as a copy of it (the fused norms add
        into the stream in place)."""
        if residual is None:
            x, residual = self.input_layernorm(x), x.clone()
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, attention)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # With tied embeddings this is a transposed copy of the embedding (113 MB more in
        # fp32 for SmolLM2-135M): the lookup wants rows, the LM head wants [in, out].
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings,
                                      cfg.rope_scaling)

    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionFn,
                logits_indices: Tensor | None = None) -> Tensor:
        """Logits for the given tokens.

        input_ids and positions share a shape: [num_tokens] (the engine's flat batch) or
        [batch, seq]. With logits_indices (flat layout only), the final norm and LM head run
        only on those rows: a prefill needs the logits of its last token alone, and the LM
        head is the largest matmul in the model.
        """
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rotary.table(positions)
        for layer in self.layers:
            x, residual = layer(x, residual, rope, attention)
        if logits_indices is not None:
            x, residual = x[logits_indices], residual[logits_indices]
        x, _ = self.norm(x, residual)
        return self.lm_head(x)


# Our fused modules -> the Hugging Face modules they are made of, in order along the output
# (model/registry.py; model/checkpoint.py loads them).
PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
