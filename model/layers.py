"""The building blocks of a decoder-only transformer, shared by every architecture here.

`Linear` is the seam for faster matmul paths: a layer that computes `x @ W^T` some other
way (packed weights, quantized codes) replaces it module for module.

On a CPU, the small ops between the matmuls (RMSNorm with its residual add, RoPE, SwiGLU's
activation) can run as one compiled kernel each (model/kernels/csrc/fused_ops_cpu.cpp) instead of
5-8 PyTorch ops: `use_fused_ops(model)` switches a loaded model over. The PyTorch code stays
the reference, and what runs on other devices.
"""

from __future__ import annotations

import logging
import math
from types import ModuleType
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import Llama3RopeScaling, ModelConfig


class FusedOps:
    """The compiled fused ops (add_rms_norm, rope_inplace, silu_mul) from the kernels module.
    Shared by every module that uses them; a deepcopy of a model shares them too."""

    def __init__(self, kernels: ModuleType) -> None:
        self.add_rms_norm = kernels.add_rms_norm
        self.rope_inplace = kernels.rope_inplace
        self.silu_mul = kernels.silu_mul

    def __deepcopy__(self, memo: dict) -> FusedOps:
        return self


class AttentionFn(Protocol):
    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor,
                 window: int | None = None) -> Tensor:
        """q: [..., num_heads, head_dim]; k, v: [..., num_kv_heads, head_dim]. With a window,
        the query at position p attends only to keys p - window + 1 .. p (sliding-window
        attention); without, to every key up to p.

        Returns the attention output shaped like q."""
        ...


def causal_attention(layer_idx: int, q: Tensor, k: Tensor, v: Tensor,
                     window: int | None = None) -> Tensor:
    """Attention of a batch of whole sequences over themselves: [batch, seq, heads, dim]."""
    mask = None
    if window is not None:
        pos = torch.arange(q.shape[1], device=q.device)
        distance = pos[:, None] - pos[None, :]  # query row minus key column
        mask = (distance >= 0) & (distance < window)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        is_causal=mask is None, enable_gqa=True)
    return out.transpose(1, 2)


class Linear(nn.Module):
    """y = x @ weight_t, with the weight kept as [in_features, out_features].

    Same math as nn.Linear (whose weight is [out, in]); on a CPU, multiplying by a
    contiguous [in, out] matrix ran 25-35% faster for 1-30 rows than F.linear did
    (measured here: 30 layers of a 30-row decode step, 60 ms -> 45 ms)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))

    matmul_path = "torch"  # what computes it, for the startup line

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight_t


class BiasedLinear(nn.Module):
    """y = x @ weight_t + bias: a `Linear` (which the faster matmul paths replace as usual)
    followed by the bias add, in PyTorch: the packed GEMM has no bias epilogue, and one add
    over the output is cheap next to the matmul. Models without biases never build one."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x) + self.bias


class RMSNorm(nn.Module):
    """RMSNorm; given the residual stream too, it first adds x into it (vLLM's fusion: the
    residual add of one block and the norm of the next are one pass over the data)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused: FusedOps | None = None  # set by use_fused_ops()

    def forward(self, x: Tensor, residual: Tensor | None = None,
                ) -> Tensor | tuple[Tensor, Tensor]:
        """norm(x); or, with a residual: residual + x, and the norm of that."""
        if self.fused is not None:
            return self._forward_fused(x, residual)
        if residual is None:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        residual = residual + x
        return F.rms_norm(residual, (x.shape[-1],), self.weight, self.eps), residual

    def _forward_fused(self, x: Tensor, residual: Tensor | None,
                       ) -> Tensor | tuple[Tensor, Tensor]:
        assert self.fused is not None
        rows = x.reshape(-1, x.shape[-1])
        if residual is None:  # no add: normalize x itself
            return self.fused.add_rms_norm(rows, rows[:0], self.weight, self.eps).view_as(x)
        stream = residual.reshape(-1, x.shape[-1])  # a view: updated in place
        normed = self.fused.add_rms_norm(stream, rows.contiguous(), self.weight, self.eps)
        return normed.view_as(x), residual


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the gain is (1 + weight), so a zero weight is the identity, and the
    norm is taken in fp32 whatever the model's dtype (as Hugging Face's Gemma3RMSNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps
        self._fused: FusedOps | None = None
        self._gain: Tensor | None = None

    @property
    def fused(self) -> FusedOps | None:
        return self._fused

    @fused.setter
    def fused(self, ops: FusedOps | None) -> None:
        """Set by use_fused_ops on the loaded model: the fp32 gain (1 + weight) is kept for
        the compiled norm, which fp32 activations then take (one op instead of five)."""
        self._fused = ops
        self._gain = None if ops is None else (1.0 + self.weight.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        if self._fused is not None and x.dtype == torch.float32:
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            return self._fused.add_rms_norm(rows, rows[:0], self._gain, self.eps).view_as(x)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


def gelu_tanh_mul(gate_up: Tensor) -> Tensor:
    """Gemma's gated MLP activation: gelu(gate) * up, GELU in its tanh approximation; gate
    and up side by side on the last axis (one matmul made both)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, rotate-half form, with a precomputed cos/sin table.

    The table is a non-persistent buffer: it follows the model through `.to()` (device and
    dtype) and stays out of the state dict."""

    def __init__(self, head_dim: int, theta: float, max_positions: int,
                 scaling: Llama3RopeScaling | None = None) -> None:
        super().__init__()
        # Computed on the CPU in fp32 (as Hugging Face does), even when the model is being
        # built on the meta device; `.to()` moves it with the weights.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        inv_freq = 1.0 / (theta**exponents)
        if scaling is not None:
            inv_freq = llama3_scaled(inv_freq, scaling)
        angles = torch.outer(torch.arange(max_positions, device="cpu").float(), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # [max_positions, head_dim]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def table(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin for these positions, shaped to broadcast over the heads axis."""
        return self.cos[positions].unsqueeze(-2), self.sin[positions].unsqueeze(-2)

    @staticmethod
    def apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def llama3_scaled(inv_freq: Tensor, scaling: Llama3RopeScaling) -> Tensor:
    """Llama 3.1's rope scaling of the frequencies. With L the original context, a frequency
    whose wavelength 2*pi/f is below L / high_freq_factor (it turns many times within L) is
    kept; one above L / low_freq_factor (less than a turn within L) is divided by `factor`;
    between the two, f is blended as (1 - s) * f / factor + s * f, where s = (L / wavelength -
    low_freq_factor) / (high_freq_factor - low_freq_factor) runs from 0 to 1 across the band."""
    context = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    turns = context * inv_freq / (2 * math.pi)  # L / wavelength
    blend = ((turns - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - blend) * inv_freq / scaling.factor + blend * inv_freq


class QKNorm(nn.Module):
    """Qwen3's RMSNorm of every query and key head (over head_dim, before RoPE), one weight
    for the query heads and one for the key heads. Both run in one pass over the fused
    q|k output [..., num_heads + num_kv_heads, head_dim], each head scaled by its own row of
    the two weights side by side. In PyTorch on every device: the fused norm kernel takes one
    weight for all rows. Gemma's gain is (1 + weight): `weight_offset` 1, the norm in fp32."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 weight_offset: float = 0.0) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.q_weight = nn.Parameter(torch.full((head_dim,), 1.0 - weight_offset))
        self.k_weight = nn.Parameter(torch.full((head_dim,), 1.0 - weight_offset))
        self.eps = eps
        self.weight_offset = weight_offset
        self._gain: Tensor | None = None  # (offset +) both weights, per head: see `fused`

    @property
    def fused(self) -> FusedOps | None:
        return None  # no compiled op of its own; set means "the weights are final"

    @fused.setter
    def fused(self, ops: FusedOps | None) -> None:
        """Set by use_fused_ops on the loaded model: the per-head gain is built once then,
        not on every call (in fp32 where there is an offset, as the call computes it)."""
        self._gain = None if ops is None else self.gain().detach()

    def gain(self) -> Tensor:
        weight = torch.cat([self.q_weight.expand(self.num_heads, -1),
                            self.k_weight.expand(self.num_kv_heads, -1)])
        return self.weight_offset + weight.float() if self.weight_offset else weight

    def forward(self, qk: Tensor) -> Tensor:
        cached = self._gain is not None and self._gain.dtype == (
            torch.float32 if self.weight_offset else qk.dtype)
        gain = self._gain if cached else self.gain()
        if self.weight_offset:
            if qk.dtype == torch.float32:
                return F.rms_norm(qk, (qk.shape[-1],), eps=self.eps) * gain
            normed = F.rms_norm(qk.float(), (qk.shape[-1],), eps=self.eps)
            return (normed * gain).to(qk.dtype)
        return F.rms_norm(qk, (qk.shape[-1],), eps=self.eps) * gain


def use_fused_ops(model: nn.Module, kernels: ModuleType | None) -> None:
    """Give every module that has a fused path the compiled ops from `kernels` (None: back to
    the PyTorch ops)."""
    fused = FusedOps(kernels) if kernels is not None else None
    for module in model.modules():
        if hasattr(module, "fused"):
            module.fused = fused


def log_torch_pieces(cfg: ModelConfig) -> None:
    """Say which parts of this architecture our CPU kernels leave to PyTorch."""
    log = logging.getLogger("nano_vllm.kernel")
    if cfg.model_type == "gemma3_text":
        log.info("gemma3_text: its per-head q/k norms and gated tanh-GELU run in PyTorch "
                 "(and its (1 + weight) RMSNorms, except in float32); the matmuls, RoPE and "
                 "the paged decode attention (with its sliding window) use our kernels")
        return
    if cfg.qkv_bias:
        log.info("%s: q/k/v biases are added in PyTorch after the QKV matmul (the packed "
                 "GEMM has no bias epilogue)", cfg.model_type)
    if cfg.qk_norm:
        log.info("%s: the per-head q/k RMSNorm runs in PyTorch (the fused norm kernel takes "
                 "one weight for all rows)", cfg.model_type)
