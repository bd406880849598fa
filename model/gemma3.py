"""Gemma 3 (text, `gemma3_text`): the decoder of model/llama.py with Gemma's changes.

Per layer: RMSNorm -> attention -> RMSNorm -> residual add, RMSNorm -> MLP -> RMSNorm ->
residual add (a norm before and after each block: four per layer). Every norm's gain is
(1 + weight) and is taken in fp32 (model/layers.py GemmaRMSNorm); so are the per-head query
and key norms (QKNorm with weight_offset 1) that run before RoPE, as in Qwen3.

- Attention: grouped-query, scaled by query_pre_attn_scalar ** -0.5 instead of
  head_dim ** -0.5. Most layers (five of every six in the released models) are
  sliding-window layers: a query attends only to the last `sliding_window` tokens. Those
  layers rotate with their own RoPE base (rope_local_theta, 10 000), the full-attention ones
  with rope_theta (1 000 000).
- MLP: down(gelu_tanh(gate(x)) * up(x)), gate and up in one matmul.
- The token embedding is scaled by sqrt(hidden_size) (rounded to the weights' dtype, as
  Hugging Face does); the LM head is tied to it; final_logit_softcapping, if set, caps the
  logits at +-cap through tanh.

The attention callable gets each layer's window (None for full attention) and applies it
itself, in the prefill masks and in the paged decode path (model/attention/). Backends scale
scores by head_dim ** -0.5, so the queries are first multiplied by
sqrt(head_dim / query_pre_attn_scalar) (1 for the released models, where both are 256).

On a CPU, the linear layers run through our packed GEMM like Llama's, and RoPE through the
fused kernel; in fp32 the (1 + weight) norms run on the fused norm kernel with their gain
added once at load. The per-head q/k norms and the GELU stay in PyTorch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import (
    AttentionFn,
    FusedOps,
    GemmaRMSNorm,
    Linear,
    QKNorm,
    RotaryEmbedding,
    gelu_tanh_mul,
)

__all__ = ["PACKED_MODULES", "Gemma3Model"]


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.window = cfg.layer_window(layer_idx)
        qkv_size = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, qkv_size)
        self.qk_norm = QKNorm(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps,
                              weight_offset=1.0)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim
        self.query_scale = (cfg.head_dim / scalar) ** 0.5  # see the module docstring
        self.fused: FusedOps | None = None  # see model/layers.py use_fused_ops

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionFn) -> Tensor:
        kv_size = self.num_kv_heads * self.head_dim
        qk, v = self.qkv_proj(x).split([self.num_heads * self.head_dim + kv_size, kv_size], dim=-1)
        qk = self.qk_norm(qk.unflatten(-1, (-1, self.head_dim)))
        if self.fused is not None:  # in place, in the normed q|k (a new tensor)
            cos, sin = (t.reshape(-1, self.head_dim) for t in rope)
            self.fused.rope_inplace(qk.reshape(-1, qk.shape[-2] * self.head_dim),
                                    qk.shape[-2], cos, sin)
        else:
            qk = RotaryEmbedding.apply(qk, *rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=-2)
        if self.query_scale != 1.0:
            q = q * self.query_scale
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        out = attention(self.layer_idx, q, k, v, window=self.window)
        return self.o_proj(out.flatten(-2))


class Gemma3MLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), with gate and up in one matmul."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(gelu_tanh_mul(self.gate_up_proj(x)))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.sliding = cfg.layer_window(layer_idx) is not None
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Gemma3Attention(cfg, layer_idx)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Gemma3MLP(cfg)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], attention: AttentionFn) -> Tensor:
        """x is the residual stream; each block's output is normed before it is added."""
        h = self.self_attn(self.input_layernorm(x), rope, attention)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # sqrt(hidden) as an fp32 number, cast to the weights' dtype with them by `.to()`.
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size ** 0.5, device="cpu"),
                             persistent=False)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Tied: a transposed copy. An encoder's output is its hidden states: no head.
        self.lm_head = None if cfg.bidirectional else Linear(cfg.hidden_size, cfg.vocab_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        local_theta = cfg.rope_local_theta or cfg.rope_theta
        self.local_rotary = RotaryEmbedding(cfg.head_dim, local_theta,
                                            cfg.max_position_embeddings)

    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionFn,
                logits_indices: Tensor | None = None) -> Tensor:
        """Logits for the given tokens; the same contract as LlamaModel.forward."""
        x = self.layer_stack(input_ids, positions, attention)
        if logits_indices is not None:
            x = x[logits_indices]
        logits = self.lm_head(self.norm(x))
        cap = self.cfg.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def hidden_states(self, input_ids: Tensor, positions: Tensor,
                      attention: AttentionFn) -> Tensor:
        """The last layer's output, normed: what an encoder hands its pooling."""
        return self.norm(self.layer_stack(input_ids, positions, attention))

    def layer_stack(self, input_ids: Tensor, positions: Tensor, attention: AttentionFn,
                    ) -> Tensor:
        x = self.embed_tokens(input_ids) * self.embed_scale
        ropes = {False: self.rotary.table(positions), True: self.local_rotary.table(positions)}
        for layer in self.layers:
            x = layer(x, ropes[layer.sliding], attention)
        return x


# Qwen3's mapping: q/k/v and gate/up fused, the query and key head norms as one QKNorm; the
# four norms a layer keep Hugging Face's names; the tied LM head is read from the embedding.
PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "qk_norm": ("q_norm", "k_norm"),
}
