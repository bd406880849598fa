"""Every knob of our compiled kernels, in one place: read from the environment once, logged
when the kernels load, and applied to the module through its `tuning` submodule (the setters
live apart from the ops: model/kernels/csrc/bindings.cpp).

- `NANO_VLLM_CPU=avx2` (`cpu`): build and run as on a CPU with AVX2 and FMA but no AVX-512
  (AMD Zen 3): `-march=x86-64-v3`, the AVX-512 flags hidden, the matmuls' AVX2 paths forced.
- `NANO_VLLM_CPU=avx512` (`cpu`): as on a CPU with AVX-512 and VNNI but neither AVX512_BF16
  nor AMX (Intel Ice Lake): `-march=icelake-server`, those flags hidden.
- `NANO_VLLM_DENSE_KERNEL=0` (`dense_kernel`): torch matmuls instead of our dense kernel.
- `NANO_VLLM_AMX=0` (`amx`): bf16 matmuls stay on AVX-512 where the CPU has AMX.
- `NANO_VLLM_BF16_FMA=N` (`bf16_fma`): the AVX-512 path computes bf16 by FMAs on widened
  weights from N row blocks (0: by vdpbf16ps, 1: always by FMAs); unset: as chosen for this
  CPU (model/kernels/csrc/dense_linear.cpp).

The emulated CPUs let one machine with AVX-512 run every CPU-specific path of every kernel
(tests/model/test_emulated_cpus.py). What is measured rather than set (the one-row-block
prefetch distance) is the start-up autotuner's: model/kernels/autotune.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import ModuleType

CPU_ENV = "NANO_VLLM_CPU"
DENSE_KERNEL_ENV = "NANO_VLLM_DENSE_KERNEL"
AMX_ENV = "NANO_VLLM_AMX"
BF16_FMA_ENV = "NANO_VLLM_BF16_FMA"
EMULATED_CPUS = ("avx2", "avx512")


class TuningError(ValueError):
    """A kernel variable with a value it cannot take (the message names it)."""


@dataclass(frozen=True)
class KernelTuning:
    """The kernels' knobs (module docstring): None or True where nothing was asked."""

    cpu: str | None = None  # "avx2" or "avx512": behave as that older CPU; None: as this one
    dense_kernel: bool = True
    amx: bool = True
    bf16_fma: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> KernelTuning:
        """The knobs the environment sets; TuningError for a value a variable cannot take."""
        cpu = environ.get(CPU_ENV, "").strip().lower()
        if cpu not in ("", "native", *EMULATED_CPUS):
            raise TuningError(f"{CPU_ENV}={cpu!r}: expected 'avx2', 'avx512' or 'native'")
        fma = environ.get(BF16_FMA_ENV, "").strip()
        if fma and not fma.lstrip("-").isdigit():
            raise TuningError(f"{BF16_FMA_ENV}={fma!r}: expected a number of row blocks")
        return cls(cpu=cpu if cpu in EMULATED_CPUS else None,
                   dense_kernel=switch(environ, DENSE_KERNEL_ENV),
                   amx=switch(environ, AMX_ENV),
                   bf16_fma=int(fma) if fma and int(fma) >= 0 else None)

    def describe(self) -> str:
        """The knobs that differ from the defaults, in words (for the log)."""
        parts = [f"as an {self.cpu.upper()} CPU ({CPU_ENV})" if self.cpu else "",
                 "" if self.dense_kernel else f"dense kernel off ({DENSE_KERNEL_ENV}=0)",
                 "" if self.amx else f"AMX off ({AMX_ENV}=0)",
                 "" if self.bf16_fma is None else
                 f"bf16 by FMAs from {self.bf16_fma} row blocks ({BF16_FMA_ENV})"]
        return "; ".join(p for p in parts if p) or "the defaults"

    def apply(self, module: ModuleType) -> None:
        """Set the knobs on the kernels module as it loads."""
        knobs = module.tuning
        if self.cpu == "avx2":
            knobs.set_dense_avx2(True)
            knobs.set_quantized_avx2(True)
        if not self.amx:
            knobs.set_dense_amx(0, 0)
        if self.bf16_fma is not None:
            knobs.set_dense_bf16_fma(self.bf16_fma)


def switch(environ: Mapping[str, str], name: str) -> bool:
    """An on/off variable: "0" turns it off, "1" or nothing leaves it on."""
    value = environ.get(name, "1").strip()
    if value not in ("0", "1", ""):
        raise TuningError(f"{name}={value!r}: expected 0 or 1")
    return value != "0"


@cache
def tuning() -> KernelTuning:
    """This process's knobs, read from the environment once."""
    return KernelTuning.from_env()
