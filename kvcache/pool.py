"""The KV cache tensors: per layer, one K and one V pool of fixed-size blocks."""

from __future__ import annotations

import re

import torch

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
    `n % BLOCK_SIZE`; written once when computed, never moved afterwards.
    """

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks (block 0 is a reserved dummy)")
        self.num_blocks = num_blocks
        shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks (K and V, every layer): (source, destination) pairs. All
        sources are read before any destination is written."""
        if not copies:
            return
        device = self.k[0].device
        source = torch.tensor([s for s, _ in copies], device=device)
        destination = torch.tensor([d for _, d in copies], device=device)
        for k, v in zip(self.k, self.v, strict=True):
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
