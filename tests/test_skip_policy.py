"""Under CI=true a kernel test may skip only where this machine lacks what the kernel needs
(tests/conftest.py turns any other skip into a failure)."""

from tests.conftest import kernel_skip_is_a_failure as fails


def test_ci_turns_a_kernel_skip_into_a_failure_where_the_kernel_can_run():
    assert fails("the fused ops could not be built here", True, True, True)
    assert fails("no AVX512_BF16 or no C++ toolchain here", True, True, True)
    assert not fails("no AVX512_BF16 or no C++ toolchain here", True, True, False)
    assert fails("no AVX-512 or no C++ toolchain here", True, True, False)
    assert not fails("no AVX-512 or no C++ toolchain here", True, False, False)
    assert not fails("no C++ toolchain to build the kernel", False, True, True)
    int8 = ("--activations int8 needs a CPU with AVX-512 and AVX512-VNNI (avx512_vnni in "
            "/proc/cpuinfo), or AVX2 with FMA and F16C, for its int8 dot products")
    assert fails(int8, True, True, True)
    assert fails(int8, True, False, False)  # AVX2 runs it too
    assert not fails(int8, True, False, False, quantized=False)


def test_on_avx2_only_the_kernels_that_need_avx512_may_skip():
    avx2_only = dict(has_compiler=True, avx512=False, avx512_bf16=False, avx2=True)
    quantized = ("the quantized weights (--weights q4_1, int8) need a CPU with AVX-512 (F, BW, "
                 "VL, DQ) or AVX2 with FMA and F16C; this one offers AVX2.")
    assert fails(quantized, **avx2_only)  # they run there: a wrong CPU check, say
    assert not fails(quantized, **{**avx2_only, "quantized": False})  # no F16C
    assert not fails("this CPU runs the AVX2 path natively", **avx2_only)
    assert fails("the CPU kernels do not run here", **avx2_only)  # a failed build, say
    assert fails("no bf16 kernel here", **avx2_only)  # the dense kernel's AVX2 path has bf16
    assert not fails("the CPU kernels do not run here", **{**avx2_only, "avx2": False})
    assert fails("this CPU runs the AVX2 path natively", True, True, True)


def test_an_optional_model_not_fetched_may_skip():
    reason = "/root/.cache/nano-vllm/gemma-3-270m-q4_k_m.gguf not fetched (benchmarks/...)"
    assert not fails(reason, True, True, True)
