"""The KV cache tensors: per layer, one K and one V pool of fixed-size blocks (with KV cache
groups, groups.py: one K and one V per place in a group, shared by that place's layers)."""

from __future__ import annotations

import re

import torch

from kvcache.groups import KVCacheGroups

BLOCK_SIZE = 16  # tokens per block
DUMMY_BLOCK = 0  # never handed out; pads short block tables


def parse_memory(text: str) -> int:
    """'2GiB', '512MiB', '1.5GB', '1000000' -> bytes."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"cannot read a memory size from {text!r}; try e.g. 2GiB or 512MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    base = 1024 if "I" in unit else 1000
    power = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[:1]]
    return int(number * base**power)


class KVCachePool:
    """k[layer] and v[layer] are [num_blocks, BLOCK_SIZE, num_kv_heads, head_dim].

    Token n of a sequence lives in block `block_table[n // BLOCK_SIZE]`, slot
    `n % BLOCK_SIZE` (the table of the layer's group); written once when computed, never
    moved afterwards. With several groups, the layers at one place of their groups share
    one tensor: k[layer] is the same object for each of them, and the block ids tell the
    groups apart.
    """

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 groups: KVCacheGroups | None = None) -> None:
        if num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks (block 0 is a reserved dummy)")
        self.groups = groups or KVCacheGroups.single(num_layers)
        if self.groups.num_layers != num_layers:
            raise ValueError(f"KV cache groups for {self.groups.num_layers} layers, "
                             f"not {num_layers}")
        self.num_blocks = num_blocks
        self.layer_group = self.groups.layer_group()
        shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        size = self.groups.group_size
        self._k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(size)]
        self._v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(size)]
        slot = self.groups.layer_slot()
        self.k = [self._k[slot[layer]] for layer in range(num_layers)]
        self.v = [self._v[slot[layer]] for layer in range(num_layers)]

    @property
    def nbytes(self) -> int:
        """The memory the pool holds (each group's K and V tensors once)."""
        return sum(t.numel() * t.element_size() for t in (*self._k, *self._v))

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks (K and V, every layer of the block's group): (source,
        destination) pairs. All sources are read before any destination is written."""
        if not copies:
            return
        device = self.k[0].device
        source = torch.tensor([s for s, _ in copies], device=device)
        destination = torch.tensor([d for _, d in copies], device=device)
        for k, v in zip(self._k, self._v, strict=True):
            k[destination] = k[source]
            v[destination] = v[source]

    @staticmethod
    def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * BLOCK_SIZE * num_kv_heads * head_dim * itemsize

    @classmethod
    def blocks_for_memory(cls, budget_bytes: int, num_layers: int, num_kv_heads: int,
                          head_dim: int, dtype: torch.dtype) -> int:
        return budget_bytes // cls.bytes_per_block(num_layers, num_kv_heads, head_dim, dtype)
