"""Large CPU tensors on 2 MB pages: the packed weights and the KV pool.

A decode step streams every weight from memory, and attention reads K/V blocks scattered
over the pool. On 4 KB pages that is a TLB miss every 4 KB and a hardware prefetcher that
stops at every page boundary. Linux backs an anonymous mapping with 2 MB pages where it is
asked to (`madvise(MADV_HUGEPAGE)`, the "madvise" setting of transparent huge pages, the
default of many distributions) and where the 2 MB are aligned, so the tensors go into one
mapping of that kind, 2 MB-aligned, each at a 4 KB-aligned offset (the kernels need 64
bytes). Where the kernel says no (no transparent huge pages, another OS), the mapping still
works, on small pages. NANO_VLLM_HUGE_PAGES=0 leaves tensors where PyTorch put them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

ENV = "NANO_VLLM_HUGE_PAGES"
HUGE_PAGE = 2 << 20
ALIGN = 4096
MADV_HUGEPAGE = 14  # Linux


def enabled() -> bool:
    """Whether tensors go to huge-page mappings here (Linux, and not turned off)."""
    return os.environ.get(ENV, "1") != "0" and hasattr(mmap, "MAP_ANONYMOUS") and \
        os.uname().sysname == "Linux"


def _advise(address: int, length: int) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_HUGEPAGE) == 0


class Arena:
    """One anonymous mapping of at least `nbytes`, 2 MB-aligned and advised to use 2 MB pages;
    `take` hands out zeroed tensors from it in order. The tensors keep the mapping alive."""

    def __init__(self, nbytes: int) -> None:
        capacity = -(-nbytes // ALIGN) * ALIGN
        size = capacity + HUGE_PAGE  # room to align the start
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        base = self._bytes.data_ptr()
        self._offset = -base % HUGE_PAGE
        self._end = self._offset + capacity
        self.huge = _advise(base + self._offset, capacity)

    def take(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed tensor of this shape and dtype, the next one in the mapping."""
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if self._offset + nbytes > self._end:
            raise ValueError(f"arena full: {nbytes} bytes asked, {self._end - self._offset} left")
        out = self._bytes[self._offset:self._offset + nbytes].view(dtype).view(shape)
        self._offset += -(-nbytes // ALIGN) * ALIGN
        return out


def arena_bytes(tensors: list[torch.Tensor]) -> int:
    """The arena size that holds these tensors at take's offsets."""
    return sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in tensors)


def move_packed_weights(model: nn.Module) -> int:
    """Every `packed` buffer of the model's modules (the kernels' weights) into one huge-page
    arena, a tensor shared by two modules (a tied LM head) moved once. The bytes moved; 0 when
    not enabled or nothing is packed on the CPU."""
    owners: dict[int, list[nn.Module]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for module in model.modules():
        packed = module._buffers.get("packed")
        if packed is not None and packed.device.type == "cpu" and packed.is_contiguous():
            owners.setdefault(id(packed), []).append(module)
            tensors[id(packed)] = packed
    if not enabled() or not tensors:
        return 0
    arena = Arena(arena_bytes(list(tensors.values())))
    for key, packed in tensors.items():
        placed = arena.take(packed.shape, packed.dtype).copy_(packed)
        for module in owners[key]:
            module._buffers["packed"] = placed
    moved = sum(t.numel() * t.element_size() for t in tensors.values())
    log.info("packed weights (%.0f MB) on %s pages", moved / 2**20,
             "2 MB" if arena.huge else "small (madvise refused)")
    return moved


def zeros(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Zeroed CPU tensors of these shapes, in one huge-page arena where enabled."""
    if not enabled():
        return [torch.zeros(shape, dtype=dtype) for shape in shapes]
    probes = [torch.empty(0, dtype=dtype).new_empty(shape, device="meta") for shape in shapes]
    arena = Arena(arena_bytes(probes))
    return [arena.take(shape, dtype) for shape in shapes]
