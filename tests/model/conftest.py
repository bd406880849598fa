"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest

from model.cpu_kernel import cpu_supports, cpu_supports_quantized, load_cpu_kernels


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
    kernels.set_quantized_avx2(True)
    try:
        yield request.param
    finally:
        kernels.set_quantized_avx2(False)
