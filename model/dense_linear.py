"""Linear layers with weights packed once for our own small-M AVX-512 GEMM kernel.

A decode step multiplies a few rows (1-30 users) by every weight matrix: that is a stream
through the weights, and the libraries here leave memory bandwidth on the table at one row
(MKL's `x @ W` 16.5 GB/s of ~36; bf16 one-row matmuls far worse). The kernel
(model/csrc/dense_linear.cpp) reads each weight matrix as column panels laid out K-major,
one contiguous stream per thread, and register-blocks the rows so that 30 rows cost a few
cache-resident passes over each panel instead of 30 streams.

`PackedLinear` replaces `model.layers.Linear` module for module; `pack_model_linears`
does it for a whole loaded model. Without the kernel (no compiler, no AVX-512 / AVX512_BF16,
not a CPU tensor) it falls back to plain torch matmuls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

log = logging.getLogger("nano_vllm.kernel")
SOURCE = Path(__file__).parent / "csrc" / "dense_linear.cpp"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@cache
def kernel_support() -> dict[str, bool]:
    """Which dtypes this CPU can run the kernel in (before trying to build it)."""
    flags = cpu_flags()
    avx512 = torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX") and {
        "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    return {"float32": avx512, "bfloat16": avx512 and "avx512_bf16" in flags}


@cache
def load_dense_linear() -> object | None:
    """The compiled extension module, or None if this CPU or toolchain cannot have it."""
    if not kernel_support()["float32"]:
        log.warning("dense-linear kernel: this CPU lacks AVX-512; using torch matmuls")
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        log.info("loading the dense-linear kernel (compiled on first use, ~1 min) ...")
        return load_inline(
            name="nano_vllm_dense_linear", cpp_sources=[SOURCE.read_text()],
            functions=["dense_linear", "set_prefetch_bytes"],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"])
    except Exception as exc:  # no compiler, no ninja, ...: fall back, loudly
        log.warning("dense-linear kernel unavailable (%s); using torch matmuls", exc)
        return None


def kernel_fn(dtype: torch.dtype) -> Callable | None:
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype)
    if name is None or not kernel_support()[name]:
        return None
    module = load_dense_linear()
    return None if module is None else module.dense_linear


def pack_weight(weight_t: Tensor, panel: int = 64) -> Tensor:
    """W [K, N] (any strides, e.g. an [N, K] weight's .t()) in the kernel's layout.

    fp32: [panels, K, panel]; bf16: [panels, ceil(K/2), panel, 2] (k pairs side by side).
    The last panel is zero padded past N, and an odd K gets a zero row in bf16."""
    k, n = weight_t.shape
    panels = -(-n // panel)
    w = torch.nn.functional.pad(weight_t, (0, panels * panel - n))  # [K, panels*panel]
    if weight_t.dtype == torch.bfloat16:
        if k % 2:
            w = torch.nn.functional.pad(w, (0, 0, 0, 1))
        w = w.view(-1, 2, panels, panel).permute(2, 0, 3, 1)
    else:
        w = w.view(k, panels, panel).permute(1, 0, 2)
    return w.contiguous()


class PackedLinear(nn.Module):
    """y = x @ W with W [K, N] packed once for the kernel (same math as model.layers.Linear).

    Build it from a Linear's weight_t [K, N], or from an [N, K] weight as `weight.t()`
    (the tied LM head packs straight from the embedding, no transposed copy kept)."""

    def __init__(self, weight_t: Tensor, panel: int = 64, max_rows: int = 1 << 30) -> None:
        super().__init__()
        self.in_features, self.out_features = weight_t.shape
        self.max_rows = max_rows
        self.kernel = kernel_fn(weight_t.dtype) if weight_t.device.type == "cpu" else None
        with torch.no_grad():
            packed = pack_weight(weight_t.detach(), panel)
        self.packed = nn.Parameter(packed, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if self.kernel is not None and rows.shape[0] <= self.max_rows and (
                rows.dtype == self.packed.dtype):
            y = self.kernel(rows.contiguous(), self.packed, self.out_features,
                            torch.get_num_threads())
        else:
            y = self.fallback(rows)
        return y.view(*lead, self.out_features)

    def fallback(self, rows: Tensor) -> Tensor:
        raise NotImplementedError
