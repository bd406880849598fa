"""What this CPU has, as our kernels see it: its flags from /proc/cpuinfo, less those an
emulated older CPU lacks ($NANO_VLLM_CPU, model/kernels/tuning.py), and which of the
kernels' paths it can run."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from model.kernels.tuning import tuning

# What each emulated CPU builds for, and the /proc/cpuinfo flags it hides from our code.
EMULATED_MARCH = {"avx2": "x86-64-v3", "avx512": "icelake-server"}
HIDDEN_FLAGS = {"avx2": ("avx512", "amx", "avx_vnni"),
                "avx512": ("avx512_bf16", "avx512_fp16", "amx", "avx_vnni", "avx512_vp2intersect")}
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # what our kernels' code needs
AVX2 = {"avx2", "fma"}  # the dense kernel's path for CPUs without AVX-512
AVX2_QUANTIZED = AVX2 | {"f16c"}  # the quantized kernels' (fp16 scales)


def emulated_cpu() -> str | None:
    """The older CPU this process is to behave as ("avx2" or "avx512"), or None for this CPU
    as it is."""
    return tuning().cpu


def as_avx2() -> bool:
    """Is this process to behave as on a CPU with AVX2 but no AVX-512 ($NANO_VLLM_CPU=avx2)?"""
    return emulated_cpu() == "avx2"


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none; without those
    the emulated CPU lacks under $NANO_VLLM_CPU); read once: every quantized layer asks at
    load."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                emulated = emulated_cpu()
                if emulated is not None:
                    flags = [f for f in flags if not f.startswith(HIDDEN_FLAGS[emulated])]
                return frozenset(flags)
    except OSError:
        pass
    return frozenset()


def cpu_supports(bf16: bool = False) -> bool:
    """Can this CPU run our AVX-512 kernels (with bf16: also AVX512_BF16)? Read from
    /proc/cpuinfo; where there is none, PyTorch's own probe decides, and bf16 is off."""
    flags = cpu_flags()
    if not flags:
        return not bf16 and torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")
    return AVX512.issubset(flags) and (not bf16 or "avx512_bf16" in flags)


def cpu_supports_avx2() -> bool:
    """Has this CPU AVX2 with FMA (what the dense kernel's second path needs where AVX-512 is
    missing)? Read from /proc/cpuinfo; where there is none, PyTorch's own probe decides."""
    flags = cpu_flags()
    if not flags:
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512", "AMX")
    return AVX2.issubset(flags)


def cpu_supports_quantized() -> bool:
    """Can this CPU run our quantized matmuls (AVX-512 F, BW, VL, DQ; or AVX2 with FMA and
    F16C)? Read from /proc/cpuinfo; where there is none, PyTorch's own probe decides."""
    return cpu_supports() or cpu_supports_avx2_quantized()


def cpu_supports_avx2_quantized() -> bool:
    """Has this CPU AVX2 with FMA and F16C (what the quantized kernels' AVX2 copies need)?
    Read from /proc/cpuinfo; where there is none, PyTorch's own probe decides."""
    flags = cpu_flags()
    if not flags:
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512", "AMX")
    return AVX2_QUANTIZED.issubset(flags)


def cpu_has_vnni() -> bool:
    """Has this CPU AVX512-VNNI (`vpdpbusd`, the int8 dot products of --activations int8)?
    Read from /proc/cpuinfo; where there is none, no."""
    return "avx512_vnni" in cpu_flags()


def cpu_identity() -> str:
    """The CPU model and flags: what -march=native compiled for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform
        return platform.processor()
    wanted = [ln for ln in lines if ln.startswith(("model name", "flags"))]
    emulated = emulated_cpu()
    return "\n".join(wanted[:2] + ([f"as {EMULATED_MARCH[emulated]}"] if emulated else []))
