"""A watch on the test process's floating-point behaviour, kept by tests/conftest.py.

Every comparison with Hugging Face in this suite runs in one long process, and rests on two
things no test states: that PyTorch's elementwise and matmul results are the same from one
test to the next (the rounding mode, denormal handling and kernel choice never change), and
that the tables computed once at load (our RoPE cos/sin, Hugging Face's inverse frequencies)
still hold what they held. If either changes, the comparisons fail far from the cause, in
RoPE-heavy tests, by amounts that look like a precision bug. The watch checks both after each
test and names the first test after which something changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

import torch
from torch import Tensor


def _fegetround():
    """C's fegetround, where the C library has it (the rounding mode of the calling thread)."""
    name = ctypes.util.find_library("m")
    try:
        return ctypes.CDLL(name).fegetround if name else None
    except OSError:
        return None


_ROUNDING = _fegetround()


def fingerprint() -> dict[str, Tensor]:
    """Results of the operations RoPE and the comparisons lean on, on small inputs, on one
    thread (the engine sets the process's thread count as it goes, and a matmul may sum in
    another order on two); an odd length gives the vectorized loops a scalar tail too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fingerprint()
    finally:
        torch.set_num_threads(threads)


def _fingerprint() -> dict[str, Tensor]:
    x = torch.linspace(0.001, 150.0, 4099)
    inv_freq = 1.0 / (100_000.0 ** (torch.arange(0, 64, 2).float() / 64))
    positions = torch.arange(100, 140).float()
    prints = {
        "cos": x.cos(), "sin": x.sin(), "exp": (x / 16).exp(), "reciprocal": 1.0 / x,
        "pow": inv_freq, "outer": torch.outer(positions, inv_freq),
        "bmm": inv_freq[None, :, None] @ positions[None, None, :],
        "matmul": x[:4096].reshape(64, 64) @ x[3:4099].reshape(64, 64),
        "denormal product": torch.tensor([1e-39]) * 1.0,
    }
    prints = {f"PyTorch's {name}": value for name, value in prints.items()}
    if _ROUNDING is not None:
        prints["the C library's rounding mode"] = torch.tensor([_ROUNDING()])
    return prints


class FloatWatch:
    """The fingerprint taken at the session's start, and tensors that must not change."""

    def __init__(self) -> None:
        self.baseline = fingerprint()
        # name -> (where the tensor is found, the tensor found there, a copy of its values)
        self.kept: dict[str, tuple[Callable[[], Tensor], Tensor, Tensor]] = {}

    def keep(self, name: str, find: Callable[[], Tensor]) -> None:
        """Watch the tensor that `find` returns (e.g. a model's buffer, which `.to()` or a
        swapped module would replace rather than change)."""
        tensor = find()
        self.kept[name] = (find, tensor, tensor.detach().clone())

    def changes(self) -> list[str]:
        """What differs from the session's start; the baseline then moves on, so a change is
        reported once, by the test after which it appeared."""
        now = fingerprint()
        changed = [name for name, value in now.items()
                   if not torch.equal(value, self.baseline[name])]
        self.baseline = now
        for name, (find, tensor, copy) in self.kept.items():
            found = find()
            if found is not tensor:
                changed.append(f"{name} (replaced by another tensor)")
            elif not torch.equal(found, copy):
                changed.append(f"{name} (changed in place: {describe_change(copy, found)})")
            else:
                continue
            self.keep(name, find)
        return changed


def describe_change(before: Tensor, after: Tensor) -> str:
    """Where and by how much a tensor changed: a stray write and a rounding look different."""
    differs = (before != after).reshape(before.shape[0], -1).any(-1).nonzero().flatten()
    delta = (after.double() - before.double()).abs().max().item()
    rows = differs.tolist()
    shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    return f"{len(rows)} rows of {before.shape[0]} (rows {shown}), max |change| {delta:.2e}"


def rope_table_error(cos: Tensor, sin: Tensor, theta: float, positions: int = 256) -> float:
    """How far a plain (unscaled) RoPE table's first `positions` rows are from the same
    angles' cos and sin in float64. An fp32 table is off by about one rounding of its angle
    (below 2e-5 up to position 255); a table made in lower precision, or written over, is off
    by far more."""
    half = cos.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return max((cos[:positions].double() - angles.cos()).abs().max().item(),
               (sin[:positions].double() - angles.sin()).abs().max().item())
