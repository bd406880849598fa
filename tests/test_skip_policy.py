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
    assert not fails("needs a CPU with AVX512-VNNI", True, True, True, False)
    assert fails("needs a CPU with AVX512-VNNI", True, True, True, True)
