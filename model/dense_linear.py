"""Linear layers with weights packed once for our own small-M GEMM kernel (AVX-512, or AVX2).

A decode step multiplies a few rows (1-30 users) by every weight matrix: that is a stream
through the weights, and the libraries here leave memory bandwidth on the table at one row
(MKL's `x @ W` reads ~20 GB/s of the ~45 a plain sum reaches; bf16 matmuls ~16). The kernel
(model/kernels/csrc/dense_linear.cpp) reads each weight matrix as column panels laid out K-major,
one contiguous stream per thread, and register-blocks the rows so that 30 rows cost one
pass over the weights from memory, not 30 (benchmarks/studies/linear_microbench.py measures it).

`PackedLinear` replaces `model.layers.Linear` module for module; `pack_model_linears`
does it for a whole loaded model. The kernel has two paths over the same packed weights:
AVX-512 and, on CPUs without it, AVX2 with FMA (model/kernels/csrc/dense_linear_avx2.cpp;
bf16 weights widened to fp32 in registers). The AVX-512 path computes bf16 by AVX512_BF16's
dot products, or where those run at half the FMAs' rate (Intel's cores, measured at first
use) by FMAs on widened weights for many rows, and on AMX from 8 rows where the CPU has it
(`bf16_arithmetic` says which). Without either path (no compiler, no AVX2, not a CPU tensor)
it falls back to plain torch matmuls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.kernels.build import load_cpu_kernels
from model.kernels.cpu import cpu_supports, cpu_supports_avx2
from model.kernels.tuning import tuning

log = logging.getLogger("nano_vllm.kernel")


@cache
def kernel_support() -> dict[str, bool]:
    """Which weight dtypes this CPU can run the kernel in (before trying to build it): both
    run on AVX2 with FMA, and on AVX-512 where the CPU has it (F, BW, VL, DQ; bfloat16 by
    vdpbf16ps or AMX where it also has AVX512_BF16, else by FMAs on widened weights). Read
    from /proc/cpuinfo; where there is none, torch's own probe decides. The environment
    variable NANO_VLLM_DENSE_KERNEL=0 turns the kernel off (model/kernels/tuning.py)."""
    if not tuning().dense_kernel:
        return {"float32": False, "bfloat16": False}
    both = cpu_supports() or cpu_supports_avx2()
    return {"float32": both, "bfloat16": both}


def kernel_isa(dtype: torch.dtype) -> str:
    """Which of the kernel's paths runs weights of this dtype here: "avx512", "avx2", or
    "none" (torch matmuls). ("avx512" for bf16 includes AMX, which takes over from 8 rows
    where the CPU has it: model/kernels/csrc/dense_linear_amx.cpp.)"""
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype)
    if name is None or not kernel_support()[name]:
        return "none"
    return "avx512" if cpu_supports() else "avx2"


def bf16_arithmetic() -> str:
    """How the kernel computes bf16 matmuls on this CPU, in words (for the start-up log)."""
    isa = kernel_isa(torch.bfloat16)
    if isa != "avx512":
        return {"avx2": "FMAs on weights widened to fp32 (AVX2)", "none": "torch"}[isa]
    if not cpu_supports(bf16=True):
        return "FMAs on weights widened to fp32 (AVX-512; this CPU has no AVX512_BF16)"
    knobs = load_dense_linear().tuning
    blocks = knobs.dense_bf16_fma_blocks()
    way = ("vdpbf16ps" if blocks == 0 else "FMAs on weights widened to fp32" if blocks == 1
           else f"vdpbf16ps, FMAs on weights widened to fp32 from {blocks} row blocks")
    way += f" (vdpbf16ps at {knobs.bf16_dot_rate():.2f}x the FMAs' rate here)"
    amx = knobs.dense_amx_usable() and tuning().amx
    return way + (", AMX from 8 rows" if amx else "")


def load_dense_linear() -> object | None:
    """The compiled kernels module (model/kernels/build.py), or None if this CPU or toolchain
    cannot have it."""
    if not kernel_support()["float32"]:
        log.warning("dense-linear kernel off (no AVX2 here, or NANO_VLLM_DENSE_KERNEL=0); "
                    "using torch matmuls")
        return None
    return load_cpu_kernels()


def kernel_fn(dtype: torch.dtype) -> Callable | None:
    """The kernel's entry point for weights of this dtype, or None where it cannot run."""
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype)
    if name is None or not kernel_support()[name]:
        return None
    module = load_dense_linear()
    return None if module is None else module.dense_linear


def choose_panel(n: int, threads: int, isa: str = "avx512") -> int:
    """The panel width for N outputs: the first of the ISA's preferred widths whose panels
    split evenly over the threads (each thread streams its own whole panels: 576 outputs are
    12 panels of 48, not 9 of 64), else the first. AVX-512 prefers the widest (64, 48, 32);
    AVX2 the narrowest (32, 48, 64): with 16 registers, one row reads three 32-column panels
    side by side (two in bf16) but only one of 64, and the extra streams from memory made
    one row's matmuls faster, many rows no slower (docs/kernel-history.md)."""
    widths = (32, 48, 64) if isa == "avx2" else (64, 48, 32)
    for panel in widths:
        if -(-n // panel) % max(threads, 1) == 0:
            return panel
    return widths[0]


def pack_weight(weight_t: Tensor, panel: int = 64) -> Tensor:
    """W [K, N] in the kernel's layout; weight_t may be any view, e.g. an [N, K] weight's .t().

    float32: [panels, K, panel]; bfloat16: [panels, ceil(K/2), panel, 2], pairs of k side by
    side. The last panel is zero padded past N, and an odd K gets a zero row in bfloat16.
    One copy of the weight is made (two if N or K needs padding)."""
    k, n = weight_t.shape
    panels = -(-n // panel)
    w_nk = weight_t.detach().t()  # [N, K]: each output's weights along k
    pad_k = k % 2 if weight_t.dtype == torch.bfloat16 else 0
    if panels * panel != n or pad_k:
        w_nk = F.pad(w_nk, (0, pad_k, 0, panels * panel - n))
    if weight_t.dtype == torch.bfloat16:
        packed = w_nk.reshape(panels, panel, (k + pad_k) // 2, 2).permute(0, 2, 1, 3)
    else:
        packed = w_nk.reshape(panels, panel, k).permute(0, 2, 1)
    return packed.contiguous()


class PackedLinear(nn.Module):
    """y = x @ W for x [..., K], W [K, N]: model.layers.Linear's math, on weights packed once
    for our kernel (float32, or bfloat16 with float32 accumulation).

    Build it from a Linear's weight_t [K, N] (`PackedLinear(linear.weight_t)` or
    `PackedLinear.from_linear(linear)`), or from an [N, K] weight without a transposed copy
    (`PackedLinear.from_weight(embedding.weight)`, the tied LM head). The packed weight
    replaces the original: memory stays one copy per matrix (plus panel padding, none for
    SmolLM2's shapes). The kernel runs at every row count: measured here it matches oneDNN at
    256-512 rows and beats it below, so no second layout is kept for prefill.

    Where the kernel cannot run (no AVX2, no compiler, another dtype or
    device) the weight is kept as it came and the layer computes `x @ weight_t`."""

    def __init__(self, weight_t: Tensor, panel: int | None = None,
                 use_kernel: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = weight_t.shape
        self.kernel = (kernel_fn(weight_t.dtype)
                       if use_kernel and weight_t.device.type == "cpu" else None)
        if self.kernel is None:
            self.weight_t = nn.Parameter(weight_t.detach(), requires_grad=False)
            self.register_buffer("packed", None)
            return
        self.panel = panel or choose_panel(self.out_features, torch.get_num_threads(),
                                           kernel_isa(weight_t.dtype))
        with torch.no_grad():
            self.register_buffer("packed", pack_weight(weight_t, self.panel))
        self.weight_t = None

    @classmethod
    def from_linear(cls, linear: nn.Module, **kwargs) -> PackedLinear:
        """From a model.layers.Linear (its weight_t [K, N])."""
        return cls(linear.weight_t, **kwargs)

    @classmethod
    def from_weight(cls, weight: Tensor, **kwargs) -> PackedLinear:
        """From an nn.Linear-style [N, K] weight (e.g. a tied embedding), packed directly."""
        return cls(weight.t(), **kwargs)

    @property
    def uses_kernel(self) -> bool:
        return self.kernel is not None

    @property
    def matmul_path(self) -> str:
        return "packed-kernel" if self.kernel is not None else "torch"

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel is not None:
            # threads=0: torch.get_num_threads(), read in C++.
            return self.kernel(x, self.packed, self.out_features, 0)
        return x @ self.weight_t

    def extra_repr(self) -> str:
        path = (f"kernel, {self.packed.dtype}, panel={self.panel}" if self.kernel is not None
                else "torch matmul")
        return f"in_features={self.in_features}, out_features={self.out_features}, {path}"


def pack_model_linears(model: nn.Module, use_kernel: bool = True) -> None:
    """Replace every model.layers.Linear in a loaded model with a PackedLinear, in place, in
    the weights' own dtype (float32 or bfloat16).

    A tied LM head is packed straight from the embedding ([vocab, hidden]), and the
    transposed copy the model kept for it is dropped. Call it after the model is loaded and
    moved to its device and dtype, and before the engine starts."""
    from model.layers import Linear

    cfg = getattr(model, "cfg", None)
    tied = bool(getattr(cfg, "tie_word_embeddings", False)) and hasattr(model, "embed_tokens")
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, Linear)]
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if name == "lm_head" and tied:
            packed = PackedLinear.from_weight(model.embed_tokens.weight, use_kernel=use_kernel)
        else:
            packed = PackedLinear.from_linear(module, use_kernel=use_kernel)
        setattr(parent, attr, packed)
    if any(isinstance(m, PackedLinear) and m.uses_kernel and m.packed.dtype == torch.bfloat16
           for m in model.modules()):
        log.info("bf16 matmuls: %s", bf16_arithmetic())
