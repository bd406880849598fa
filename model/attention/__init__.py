"""Attention backends over the paged KV cache, behind one registry.

Each backend builds its own step metadata (`build_metadata`) and is the `attention`
callable the model receives for that step. Adding one: a class with those two methods,
an entry in `AttentionBackend`, and a line in `create_backend`.
"""

from __future__ import annotations

from enum import StrEnum

import torch

from kvcache.pool import KVCachePool
from model.attention.metadata import StepMetadata
from model.attention.paged import CpuKernelAttention, TorchPagedAttention
from model.kernels.build import (
    load_cpu_kernels,
    load_paged_decode_attention,
    load_paged_prefill_attention,
    load_paged_prefill_attention_chunks,
)

__all__ = ["AttentionBackend", "CpuKernelAttention", "StepMetadata", "TorchPagedAttention",
           "create_backend", "resolve_backend"]


class AttentionBackend(StrEnum):
    AUTO = "auto"
    TORCH = "torch"  # gather the blocks, then PyTorch SDPA with a mask: any device, any dtype
    CPU_KERNEL = "cpu-kernel"  # compiled kernels reading K/V in place: CPU, fp32 or bf16


def resolve_backend(requested: str, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """'auto' is the compiled kernel where it applies, else gather + SDPA."""
    name = AttentionBackend(requested)
    fits = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
    if name is AttentionBackend.AUTO:
        return AttentionBackend.CPU_KERNEL if fits else AttentionBackend.TORCH
    if name is AttentionBackend.CPU_KERNEL and not fits:
        raise ValueError("--attention cpu-kernel needs --device cpu and --dtype float32 or "
                         "bfloat16")
    return name


def create_backend(requested: str, pool: KVCachePool) -> TorchPagedAttention:
    """The backend for this pool's device and dtype; falls back to the PyTorch path (with a
    warning from the loader) if the kernel cannot be built here."""
    name = resolve_backend(requested, pool.k[0].device, pool.k[0].dtype)
    if name is AttentionBackend.CPU_KERNEL:
        kernel = load_paged_decode_attention()
        if kernel is not None:
            amx_sdpa = (pool.k[0].dtype == torch.bfloat16
                        and load_cpu_kernels().tuning.dense_amx_usable())
            return CpuKernelAttention(pool, kernel, load_paged_prefill_attention(), amx_sdpa,
                                      load_paged_prefill_attention_chunks())
    return TorchPagedAttention(pool)
