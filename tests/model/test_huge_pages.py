"""Packed weights and the KV pool on 2 MB pages (model/huge_pages.py): where the tensors land,
that they keep their values, and that the switch turns it off."""

from __future__ import annotations

import pytest
import torch

from kvcache.pool import KVCachePool
from model import huge_pages
from model.dense_linear import PackedLinear
from model.huge_pages import HUGE_PAGE, Arena, move_packed_weights

pytestmark = pytest.mark.skipif(not huge_pages.enabled(), reason="Linux only")


def test_arena_hands_out_aligned_zeroed_tensors_and_refuses_past_its_end():
    arena = Arena(3 * 4096 + 10)
    first = arena.take((1000,), torch.float32)  # 4,000 bytes: the next starts 4 KB on
    second = arena.take((2, 3), torch.bfloat16)
    assert first.data_ptr() % HUGE_PAGE == 0
    assert second.data_ptr() - first.data_ptr() == 4096
    assert torch.equal(first, torch.zeros(1000))
    assert torch.equal(second, torch.zeros(2, 3, dtype=torch.bfloat16))
    second.fill_(1)  # writable, and no neighbour is touched
    assert torch.equal(first, torch.zeros(1000))
    with pytest.raises(ValueError, match="arena full"):
        arena.take((4 * 4096,), torch.uint8)


def test_moved_weights_keep_their_values_and_a_shared_tensor_stays_shared():
    torch.manual_seed(0)
    model = torch.nn.Sequential(PackedLinear(torch.randn(64, 96)),
                                PackedLinear(torch.randn(96, 32)))
    tied = torch.nn.Module()
    tied.register_buffer("packed", model[1].packed)
    model.append(tied)
    x = torch.randn(3, 64)
    before = model[1](model[0](x))
    packed = [m.packed.clone() for m in model[:2]]
    moved = move_packed_weights(model)
    assert moved == sum(p.numel() * p.element_size() for p in packed)
    assert model[0].packed.data_ptr() % HUGE_PAGE == 0
    assert tied.packed is model[1].packed
    assert all(torch.equal(m.packed, p) for m, p in zip(model[:2], packed))
    assert torch.equal(model[1](model[0](x)), before)


def test_switched_off_nothing_moves(monkeypatch):
    monkeypatch.setenv(huge_pages.ENV, "0")
    layer = torch.nn.Sequential(PackedLinear(torch.randn(64, 96)))
    where = layer[0].packed.data_ptr()
    assert move_packed_weights(layer) == 0 and layer[0].packed.data_ptr() == where


def test_kv_pool_in_one_aligned_mapping():
    pool = KVCachePool(num_layers=3, num_blocks=8, num_kv_heads=3, head_dim=64)
    assert pool.k[0].data_ptr() % HUGE_PAGE == 0
    assert all(torch.count_nonzero(t) == 0 for t in pool.k + pool.v)
    assert len({t.data_ptr() for t in pool.k + pool.v}) == 6
