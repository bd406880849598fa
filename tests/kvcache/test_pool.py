"""Sizing the KV pool from a memory budget."""

from __future__ import annotations

import pytest
import torch

from kvcache.pool import KVCachePool, parse_memory


@pytest.mark.parametrize(("text", "expected"), [
    ("2GiB", 2 * 1024**3), ("512MiB", 512 * 1024**2), ("1.5GB", 1_500_000_000),
    ("1000000", 1_000_000), (" 64 kib ", 64 * 1024), ("3T", 3 * 1000**4),
])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "2XB", "-1GiB", "1e3"])
def test_parse_memory_rejects_nonsense(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_memory(text)


def test_blocks_for_memory_matches_bytes_per_block():
    # SmolLM2: 30 layers, 3 K/V heads, head dim 64: 2 * 30 * 16 * 3 * 64 * 4 bytes in fp32.
    per_block = KVCachePool.bytes_per_block(30, 3, 64, torch.float32)
    assert per_block == 737_280
    assert KVCachePool.blocks_for_memory(parse_memory("2GiB"), 30, 3, 64, torch.float32) == (
        2 * 1024**3 // 737_280)
    assert KVCachePool.bytes_per_block(30, 3, 64, torch.bfloat16) == per_block // 2
