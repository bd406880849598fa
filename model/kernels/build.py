"""Our compiled CPU kernels (model/kernels/csrc/), built on first use.

Built with PyTorch's C++ extension tooling (needs a C++ compiler and ninja; about a
minute each, then cached under ~/.cache/torch_extensions). The build is keyed by the
source and by this CPU's model and instruction flags: `-march=native` code built on one
CPU must not be loaded on another, and two checkouts with different sources must not
rebuild over each other. If a kernel cannot be built, the caller is told (None) and
falls back to a PyTorch path, loudly. One build at a time per module (build_lock): a
build that died (a server stopped during its first start) does not stop the next one.
`python3 -m model.kernels.build` builds the module ahead, e.g. into an image.

Under an emulated older CPU ($NANO_VLLM_CPU: model/kernels/tuning.py) the module is built for
that CPU's target (`-march=x86-64-v3` or `-march=icelake-server`); the kernels take a path only
where the build's target has its instructions too, so on the emulated Ice Lake bf16 matmuls
take the AVX2 path, as on such a CPU. The knobs are applied as the module loads, and logged.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from types import ModuleType

from model.kernels.cpu import EMULATED_MARCH, cpu_identity, emulated_cpu
from model.kernels.tuning import tuning

log = logging.getLogger("nano_vllm.kernel")
CSRC = Path(__file__).parent / "csrc"
# -ffast-math lets exp() vectorize; our kernels never see inf or NaN.
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


def cflags() -> list[str]:
    """The compiler flags: CFLAGS, for the emulated CPU's target instead of this CPU's under
    $NANO_VLLM_CPU."""
    emulated = emulated_cpu()
    if emulated is None:
        return CFLAGS
    return [f for f in CFLAGS if f != "-march=native"] + [f"-march={EMULATED_MARCH[emulated]}",
                                                          "-mtune=native"]


def module_name() -> str:
    """The kernels module's name: keyed by the sources, this CPU and the flags (docstring)."""
    files = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))
    digest = hashlib.sha256()
    for part in [*(f.read_bytes() for f in files), cpu_identity().encode(),
                 *(flag.encode() for flag in cflags())]:
        digest.update(part + b"\0")
    return f"nano_vllm_cpu_kernels_{digest.hexdigest()[:12]}"


def build_directory(name: str) -> Path | None:
    """Where PyTorch builds (and caches) the module `name`: under $TORCH_EXTENSIONS_DIR, or
    ~/.cache/torch_extensions; None if this PyTorch does not say (then no build_lock)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return Path(_get_build_directory(name, verbose=False))
    except (ImportError, AttributeError, TypeError):
        return None


@contextmanager
def build_lock(directory: Path | None) -> Iterator[None]:
    """Hold the build of the module in `directory` for this process.

    PyTorch's own lock is a file that its builder deletes when done: a builder that dies
    (a server stopped during its first start) leaves it behind, and every later start would
    wait on it for ever. This lock is an flock in the same folder, which the kernel drops with
    its holder; whoever holds it is the only live builder, so a PyTorch lock file found then
    is a dead one's: the compilers that build may have left running (ninja starts each in a
    process group of its own) are ended, and the file removed."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "nano-vllm.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = directory / "lock"
        if stale.exists():
            ended = end_processes_working_in(directory)
            log.warning("removing %s, left by a kernel build that did not finish%s", stale,
                        f" (ended {ended} of its compilers)" if ended else "")
            stale.unlink()
        yield


def processes_working_in(directory: Path) -> list[int]:
    """The live processes whose working folder is `directory` or below (a build's compilers:
    ninja runs them there; a zombie has no working folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(directory):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, a zombie, or not ours to read
            pass
    return found


def end_processes_working_in(directory: Path, timeout: float = 10.0) -> int:
    """SIGKILL every process working in `directory` (a dead build's compilers); wait until
    they are gone. How many there were."""
    pids = processes_working_in(directory)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while processes_working_in(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


@cache
def build_cpu_kernels() -> tuple[ModuleType | None, str | None]:
    """The extension module with every kernel in model/kernels/csrc/ (bindings.cpp lists them), and
    None; or None and why it could not be built here. One module, so a first start
    compiles once (the sources in parallel, as separate objects)."""
    try:
        from torch.utils.cpp_extension import load

        name = module_name()
        log.info("loading the CPU kernels (compiled on first use, about a minute) ...")
        with build_lock(build_directory(name)):
            module = load(name=name, sources=[str(f) for f in sorted(CSRC.glob("*.cpp"))],
                          extra_cflags=cflags(), extra_ldflags=["-fopenmp"])
        tuning().apply(module)
        log.info("kernel tuning: %s", tuning().describe())
        return module, None
    except Exception as exc:  # no compiler, no ninja, ...: fall back, loudly
        log.warning("CPU kernels unavailable (%s); using the PyTorch paths", exc)
        return None, f"{type(exc).__name__}: {exc}"


def load_cpu_kernels() -> ModuleType | None:
    """The kernels module, or None if it could not be built here (cpu_kernels_error says
    why)."""
    return build_cpu_kernels()[0]


def cpu_kernels_error() -> str | None:
    return build_cpu_kernels()[1]


def load_paged_decode_attention() -> Callable | None:
    """The decode-attention kernel, or None if the kernels could not be built here."""
    kernels = load_cpu_kernels()
    return None if kernels is None else kernels.paged_decode_attention


def load_paged_prefill_attention() -> Callable | None:
    """The prefill-chunk attention kernel, or None if the kernels could not be built here."""
    kernels = load_cpu_kernels()
    return None if kernels is None else kernels.paged_prefill_attention


def load_paged_prefill_attention_chunks() -> Callable | None:
    """The same kernel taking several prefill chunks in one call, or None."""
    kernels = load_cpu_kernels()
    return None if kernels is None else kernels.paged_prefill_attention_chunks


def load_fused_ops() -> ModuleType | None:
    """The fused small ops (RMSNorm with its residual add, RoPE, SwiGLU's activation): the
    kernels module itself, or None."""
    return load_cpu_kernels()


def main() -> int:
    """Build (or find) the kernels module: 0 if it loads, 1 if it cannot be built here."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return 0 if load_cpu_kernels() is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
