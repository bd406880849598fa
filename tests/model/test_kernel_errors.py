"""A kernel that fails inside its OpenMP region raises an error instead of ending the process.

An exception may not leave an OpenMP region: one that does calls std::terminate, and the
engine core process dies with every request in it. The attention kernels allocate inside
their regions, so each runs here in a child process whose address space is then capped just
above what it holds: the region's allocations fail, and the kernel must raise a RuntimeError
that says so (the engine then fails that step's requests only, tests/engine) and leave the
process able to run the kernel again once memory is back.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from model.kernels.build import load_cpu_kernels

pytestmark = pytest.mark.skipif(load_cpu_kernels() is None,
                                reason="no C++ toolchain to build the kernels")
ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent('''
    import resource, sys
    import torch
    from model.kernels.build import load_cpu_kernels

    kernels = load_cpu_kernels()
    torch.set_num_threads(2)
    kind = sys.argv[1]

    def call(wide: bool):
        """The kernel's arguments; `wide`: a shape whose buffers inside the region are 128 MB,
        more than a thread's malloc arena holds (64 MB), while its output is 8 MB."""
        if kind == "prefill":  # one position, one head of 2M values: a task's q is 16 x that
            dim = 1 << 21 if wide else 64
            q, k = torch.ones(1, 1, dim), torch.zeros(1, 16, 1, dim)
            return lambda: kernels.paged_prefill_attention(q, k, k, torch.tensor([0]), 1, 0.1, 0)
        heads = 1 << 17 if wide else 4  # decode: each task's scores are heads x 256 floats
        q, k = torch.ones(1, heads, 16), torch.zeros(1, 16, 1, 16)
        return lambda: kernels.paged_decode_attention(q, k, k, torch.tensor([[0]]),
                                                      torch.tensor([1]), 0.1, 0)

    call(False)()  # the OpenMP threads and their memory arenas exist before the cap
    wide = call(True)
    size_kb = int(next(line.split()[1] for line in open("/proc/self/status")
                       if line.startswith("VmSize:")))
    limit = (size_kb + 32 * 1024) * 1024  # room for the output, not for the buffers
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    try:
        wide()
        print("no error")
    except RuntimeError as exc:
        print(f"RuntimeError: {exc}".splitlines()[0])
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("again:", bool(torch.isfinite(wide()).all()))
''')


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_an_allocation_failing_inside_the_region_is_an_error(kind):
    child = subprocess.run([sys.executable, "-c", CHILD, kind], cwd=ROOT, capture_output=True,
                           text=True, timeout=240)
    print(f"child exit {child.returncode}: {child.stdout.strip()!r}")
    assert child.returncode == 0, child.stderr[-2000:]
    first, again = child.stdout.strip().splitlines()[-2:]
    assert first.startswith("RuntimeError:") and "parallel region" in first, first
    assert again == "again: True"
