"""The kernels' tests again, as on the older CPUs this machine can stand in for.

Part of each kernel's path is chosen when it is compiled (the attention kernels' AVX-512 or
AVX2 code) and part when it runs (bf16 matmuls on AVX512_BF16, on AMX, or on the AVX2 path),
so a suite run on one CPU checks that CPU's paths only. `NANO_VLLM_CPU` (model/kernels/build.py)
builds the kernels for an older target and hides what it lacks; here each target's build runs
the attention, fused-op and Gemma-shape tests in a child pytest (about a minute to compile,
half a minute to run, per target):
- `avx512`: AVX-512 with VNNI, no AVX512_BF16, no AMX (Intel Ice Lake);
- `avx2`: AVX2 and FMA, no AVX-512 (AMD Zen 3).
A target this CPU cannot run, or its own, is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.kernels.build import load_cpu_kernels
from model.kernels.cpu import cpu_flags, cpu_supports
from model.kernels.tuning import CPU_ENV

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/model/test_gemma_shapes.py", "tests/model/test_prefill_kernel.py",
         "tests/model/test_cpu_kernel.py", "tests/model/test_fused_ops.py",
         "tests/model/test_dense_linear.py::test_amx_is_used_where_the_cpu_has_it",
         "tests/model/test_dense_linear.py::test_bf16_takes_avx512_wherever_fp32_does",
         "tests/model/test_kernel_errors.py"]


def runnable(target: str) -> str | None:
    """Why `target` cannot be emulated here, or None."""
    if load_cpu_kernels() is None:
        return "no C++ toolchain to build the kernels"
    if os.environ.get(CPU_ENV):
        return f"this run is itself emulated ({CPU_ENV}={os.environ[CPU_ENV]})"
    if not cpu_supports():
        return "an older CPU than AVX-512 cannot stand in for another"
    if target == "avx512" and not {"avx512_bf16", "amx_tile"} & cpu_flags():
        return "this CPU is already AVX-512 without AVX512_BF16 or AMX: the native run checks it"
    if target == "avx512" and "avx512_vnni" not in cpu_flags():
        return "Ice Lake's target needs AVX512-VNNI"
    return None


@pytest.mark.parametrize("target", ["avx512", "avx2"])
def test_kernel_tests_pass_as_on_an_older_cpu(target):
    reason = runnable(target)
    if reason:
        pytest.skip(reason)
    env = {**os.environ, CPU_ENV: target, "ATEN_CPU_CAPABILITY": target}
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            *TESTS], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=280)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    print(f"{CPU_ENV}={target}: {summary}")
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert " passed" in summary and " skipped" not in summary, summary
