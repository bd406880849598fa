"""Our compiled CPU kernels (model/csrc/), built on first use.

Built with PyTorch's C++ extension tooling (needs a C++ compiler and ninja; about a
minute each, then cached under ~/.cache/torch_extensions). The build is keyed by the
source and by this CPU's model and instruction flags: `-march=native` code built on one
CPU must not be loaded on another, and two checkouts with different sources must not
rebuild over each other. If a kernel cannot be built, the caller is told (None) and
falls back to a PyTorch path, loudly.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

log = logging.getLogger("nano_vllm.kernel")
CSRC = Path(__file__).parent / "csrc"
# -ffast-math lets exp() vectorize; our kernels never see inf or NaN.
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


def cpu_identity() -> str:
    """The CPU model and flags: what -march=native compiled for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform
        return platform.processor()
    wanted = [ln for ln in lines if ln.startswith(("model name", "flags"))]
    return "\n".join(wanted[:2])


def compile_cpu_extension(name: str, source_file: str, functions: list[str]) -> ModuleType:
    """Build (or load the cached build of) model/csrc/<source_file>; raises if it cannot."""
    from torch.utils.cpp_extension import load_inline

    source = (CSRC / source_file).read_text()
    key = hashlib.sha256("\0".join([source, cpu_identity(), *CFLAGS]).encode()).hexdigest()
    return load_inline(name=f"{name}_{key[:12]}", cpp_sources=[source], functions=functions,
                       extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"])


@cache
def load_paged_decode_attention() -> Callable | None:
    """The decode-attention kernel's entry point, or None if it could not be built here."""
    try:
        log.info("loading the CPU paged-attention kernel (compiled on first use, ~1 min) ...")
        module = compile_cpu_extension("nano_vllm_paged_attention", "paged_attention_cpu.cpp",
                                       ["paged_decode_attention"])
        return module.paged_decode_attention
    except Exception as exc:  # no compiler, no ninja, ...: fall back, loudly
        log.warning("CPU paged-attention kernel unavailable (%s); using the PyTorch path", exc)
        return None


@cache
def load_fused_ops() -> ModuleType | None:
    """The fused small ops (RMSNorm with its residual add, RoPE, SwiGLU's activation), or
    None if they could not be built here."""
    try:
        log.info("loading the CPU fused-ops kernels (compiled on first use, ~1 min) ...")
        return compile_cpu_extension("nano_vllm_fused_ops", "fused_ops_cpu.cpp",
                                     ["add_rms_norm", "rope_inplace", "silu_mul"])
    except Exception as exc:  # no compiler, no ninja, ...: fall back, loudly
        log.warning("CPU fused ops unavailable (%s); using PyTorch ops", exc)
        return None
