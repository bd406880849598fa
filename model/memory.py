"""What a model will take in memory, what this machine has free, and the check between them
made before anything large is allocated.

`available_bytes()` is the least of what the kernel would give this process: /proc/meminfo's
MemAvailable, a cgroup's limit less its usage (a container), and an address-space limit
(`ulimit -v`) less what is already mapped. `weights_bytes()` is what the weights will hold in
the format they load in: a GGUF file's tensors in our kernels' forms (model/gguf/codes.py) or
dequantized, a folder's safetensors in --dtype. `check_fits()` refuses a model whose weights
do not fit, naming both numbers, so that a start never ends in the OOM killer or a numpy
MemoryError halfway through the load.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
from pathlib import Path

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelTooLarge(MemoryError):
    """The model's weights need more memory than is free; the message says how much."""


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_bytes() -> int | None:
    """The memory this process could still take, or None where nothing says (not Linux)."""
    limits = [_meminfo_available()]
    cgroup_max, cgroup_used = (_read_int("/sys/fs/cgroup/memory.max"),
                               _read_int("/sys/fs/cgroup/memory.current"))
    if cgroup_max is not None and cgroup_used is not None:
        limits.append(cgroup_max - cgroup_used)
    address_limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if address_limit != resource.RLIM_INFINITY:
        limits.append(address_limit - (_mapped_bytes() or 0))
    known = [limit for limit in limits if limit is not None]
    return max(0, min(known)) if known else None


def _mapped_bytes() -> int | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def gguf_weights_bytes(path: Path, weights: str, dtype: str = "float32") -> int:
    """A GGUF file's weights as `weights` ("gguf": our kernels' forms; "dense": --dtype
    arrays) will hold them, from its header alone."""
    from gguf import GGMLQuantizationType

    from model.gguf.codes import FORM_OF, KERNEL_TYPES
    from model.gguf.header import read_tensor_extents
    from model.weights.blocks import FORM_BYTES, UNIT_WEIGHTS

    total = 0.0
    for tensor in read_tensor_extents(path)[0]:
        count = 1
        for dim in tensor.dims:
            count *= int(dim)
        try:
            kind = GGMLQuantizationType(tensor.type_id).name
        except ValueError:
            kind = "F32"
        if weights == "gguf" and len(tensor.dims) == 2 and kind in KERNEL_TYPES:
            form = FORM_OF.get(kind, kind)
            total += count * FORM_BYTES[form] / UNIT_WEIGHTS[form]
        else:
            total += count * DTYPE_BYTES.get(dtype, 4)
    return int(total)


def folder_weights_bytes(path: Path, dtype: str = "float32") -> int:
    """A Hugging Face folder's safetensors in --dtype (their shapes, read without the data)."""
    from safetensors import safe_open

    total = 0
    for file in path.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                count = 1
                for dim in f.get_slice(name).get_shape():
                    count *= dim
                total += count * DTYPE_BYTES.get(dtype, 4)
    return total


def weights_bytes(path: Path, weights: str, dtype: str = "float32") -> int | None:
    """What the weights of `path` take once loaded as `weights` (a resolved --weights)."""
    if path.is_file():
        return gguf_weights_bytes(path, weights, dtype)
    if weights == "dense":
        return folder_weights_bytes(path, dtype)
    return None  # the default model's own GGUF codes, or int8 made at load: small models


def check_fits(path: Path, weights: str, dtype: str = "float32") -> None:
    """ModelTooLarge, before anything is read, where the weights alone need more than is
    free. (The KV cache is sized afterwards from what is left: --kv-cache-memory.)"""
    need, free = weights_bytes(path, weights, dtype), available_bytes()
    if need is None or free is None or need <= free:
        return
    hint = (" A GGUF file runs on its own codes by default: drop --weights dense."
            if weights == "dense" and path.is_file() else "")
    raise ModelTooLarge(f"{path.name}: its weights need {need / GIB:.1f} GiB as {weights} "
                        f"weights, and this machine has {free / GIB:.1f} GiB free (MemAvailable, "
                        f"cgroup and address-space limits).{hint}")


def describe_start_error(exc: BaseException) -> str:
    """A start-up error as one line: ModelTooLarge says it all; another MemoryError (numpy's
    says only how big an array it failed to allocate) is named as running out of memory."""
    if isinstance(exc, MemoryError) and not isinstance(exc, ModelTooLarge):
        return (f"out of memory while loading the model ({type(exc).__name__}: {exc}); "
                "free memory, or choose a smaller model or --kv-cache-memory")
    return str(exc)


def give_back_freed_memory() -> None:
    """Hand freed heap pages back to the kernel (glibc keeps them after the load's large
    temporaries otherwise); a no-op where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
