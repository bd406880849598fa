"""Fixtures of the kernel tests."""

from __future__ import annotations

import os

import pytest
import torch

from model.dense_linear import kernel_fn
from model.kernels.build import load_cpu_kernels
from model.kernels.cpu import as_avx2, cpu_supports, cpu_supports_avx2, cpu_supports_quantized
from model.kernels.tuning import AMX_ENV

# The dense matmul kernel's paths (model/kernels/csrc/dense_linear.cpp), for its tests and
# those that run it at a model's shapes.
FP32_OK = kernel_fn(torch.float32) is not None
BF16_OK = kernel_fn(torch.bfloat16) is not None
needs_fp32 = pytest.mark.skipif(not FP32_OK, reason="no AVX2 or no C++ toolchain here")
needs_bf16 = pytest.mark.skipif(not BF16_OK, reason="no AVX2 or no C++ toolchain here")
# The kernel's paths: the one this CPU picks, and where that is AVX-512 the AVX2 one forced
# too, so that both are checked on every machine with AVX-512.
PATHS = ["native"] + (["avx2"] if FP32_OK and cpu_supports() and cpu_supports_avx2() else [])
# Where the CPU has AMX, bf16 from 8 rows runs on it; "no-amx" keeps the AVX-512 path tested.
AMX = FP32_OK and cpu_supports(bf16=True) and load_cpu_kernels().tuning.dense_amx_usable()
# The AVX-512 path computes bf16 by vdpbf16ps or by FMAs on widened weights, as chosen for the
# CPU; "dot" and "fma" force each for every row count (AMX off), so both are tested anywhere.
BF16_AVX512 = FP32_OK and cpu_supports(bf16=True)
# bf16 tests take every path; fp32 never runs on AMX nor on bf16's two ways, so its tests skip
# those.
BF16_PATHS = PATHS + (["no-amx"] if AMX else []) + (["dot", "fma"] if BF16_AVX512 else [])
DTYPE_PATHS = ([pytest.param(torch.float32, p, id=f"float32-{p}") for p in PATHS]
               + [pytest.param(torch.bfloat16, p, id=f"bfloat16-{p}") for p in BF16_PATHS])
# The kernel's defaults (model/kernels/csrc/dense_linear.cpp; none under NANO_VLLM_AMX=0).
AMX_ROWS = 0 if os.environ.get(AMX_ENV, "1") == "0" else 8
AMX_CHUNK = 0  # all of K
BF16_FMA = {"dot": 0, "fma": 1}  # set_dense_bf16_fma's blocks for those paths (else -1)


@pytest.fixture(params=PATHS)
def path(request):
    """Which of the kernel's paths the test runs (set in the kernels module, reset after)."""
    if request.param == "native":
        yield request.param
        return
    kernels = load_cpu_kernels()
    kernels.tuning.set_dense_avx2(request.param == "avx2" or as_avx2())
    kernels.tuning.set_dense_amx(AMX_ROWS if request.param == "avx2" else 0, AMX_CHUNK)
    kernels.tuning.set_dense_bf16_fma(BF16_FMA.get(request.param, -1))
    try:
        yield request.param
    finally:
        kernels.tuning.set_dense_avx2(as_avx2())
        kernels.tuning.set_dense_amx(AMX_ROWS, AMX_CHUNK)
        kernels.tuning.set_dense_bf16_fma(-1)


def quantized_paths() -> list[str]:
    """The quantized matmuls' copies to test: the one this CPU picks, and where that is the
    AVX-512 one, the AVX2 copy forced too, so that both are checked on every such machine."""
    both = cpu_supports() and cpu_supports_quantized() and load_cpu_kernels() is not None
    return ["native", "avx2"] if both else ["native"]


@pytest.fixture(params=quantized_paths())
def quantized_path(request):
    """Which copy of the quantized matmuls the test runs (set in the kernels module, reset
    after)."""
    if request.param == "native":
        yield request.param
        return
    kernels = load_cpu_kernels()
    kernels.tuning.set_quantized_avx2(True)
    try:
        yield request.param
    finally:
        kernels.tuning.set_quantized_avx2(False)
