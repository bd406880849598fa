"""The compiled CPU decode-attention kernel (model/csrc/paged_attention_cpu.cpp).

Built on first use with PyTorch's C++ extension tooling (needs a C++ compiler and
ninja; about a minute, then cached under ~/.cache/torch_extensions). If it cannot be
built, the engine says so once and uses the pure-PyTorch path instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from pathlib import Path

log = logging.getLogger("nano_vllm.kernel")
SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"


@cache
def load_paged_decode_attention() -> Callable | None:
    """The kernel's Python entry point, or None if it could not be built here."""
    try:
        from torch.utils.cpp_extension import load_inline

        log.info("loading the CPU paged-attention kernel (compiled on first use, ~1 min) ...")
        module = load_inline(
            name="nano_vllm_paged_attention", cpp_sources=[SOURCE.read_text()],
            functions=["paged_decode_attention"],
            # -ffast-math lets exp() vectorize; the kernel never sees inf or NaN (it reads
            # only slots below each context length).
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"],
            extra_ldflags=["-fopenmp"])
        return module.paged_decode_attention
    except Exception as exc:  # no compiler, no ninja, ...: fall back, loudly
        log.warning("CPU paged-attention kernel unavailable (%s); using the PyTorch path", exc)
        return None
