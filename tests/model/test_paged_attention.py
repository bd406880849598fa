"""Paged prefill, paged decode and prefix hits against Hugging Face's logits."""

from __future__ import annotations

import pytest
import torch

from engine.model_runner import ModelRunner
from engine.step_types import SequenceStep
from kvcache.block_allocator import BlockAllocator
from kvcache.groups import KVCacheGroups
from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks
from kvcache.pool import BLOCK_SIZE, KVCachePool
from model.attention import StepMetadata, TorchPagedAttention
from tests.conftest import LOGITS_ATOL

torch.set_grad_enabled(False)


# Attention has two implementations: PyTorch gather + SDPA, and the compiled CPU kernels
# (when they can be built here). Tests that run the model run against both.
BACKENDS = ["torch", "cpu-kernel"]


def make_runner(model, num_blocks: int = 64,
                backend: str = "torch") -> tuple[ModelRunner, KVCacheManager]:
    """A runner and its manager over one pool, in the model's KV cache groups (one for a
    model without sliding windows)."""
    cfg = model.cfg
    groups = KVCacheGroups.from_windows(cfg.layer_windows())
    pool = KVCachePool(cfg.num_layers, num_blocks, cfg.num_kv_heads, cfg.head_dim,
                       groups=groups)
    runner = ModelRunner(model, pool, backend)
    if runner.attention_backend != backend:
        pytest.skip(f"{backend} attention is not available here")
    return runner, KVCacheManager(BlockAllocator(num_blocks), groups)


def hf_last_logits(hf_model, ids: list[int]) -> torch.Tensor:
    return hf_model(torch.tensor([ids])).logits[0, -1]


def prompt_ids(tokenizer, n: int, seed: int) -> list[int]:
    """A real-text prompt of exactly n tokens."""
    text = " ".join(f"Sentence {seed}-{i} says the weather is mild today." for i in range(n))
    return tokenizer(text).input_ids[:n]


def test_write_path_stores_each_token_in_its_slot():
    pool = KVCachePool(num_layers=1, num_blocks=8, num_kv_heads=3, head_dim=64)
    attention = TorchPagedAttention(pool)
    table = [5, 2, 7]  # deliberately out of order
    n = 40
    k, v = torch.randn(n, 3, 64), torch.randn(n, 3, 64)
    attention.step = StepMetadata.build([], [(table, n, n)])
    attention(0, torch.randn(n, 9, 64), k, v)
    for pos in range(n):
        block, slot = table[pos // BLOCK_SIZE], pos % BLOCK_SIZE
        assert torch.equal(pool.k[0][block, slot], k[pos])
        assert torch.equal(pool.v[0][block, slot], v[pos])
    untouched = [b for b in range(8) if b not in table]
    assert all(pool.k[0][b].abs().sum() == 0 for b in untouched)
    print(f"{n} tokens written to blocks {table}; other blocks untouched")


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_prefill_matches_hf(model, hf_model, tokenizer, backend):
    runner, manager = make_runner(model, backend=backend)
    for n in (5, 16, 37):
        ids = prompt_ids(tokenizer, n, seed=n)
        blocks = SequenceBlocks()
        assert manager.allocate_slots(blocks, n)
        logits = runner.compute_logits([SequenceStep(ids, 0, blocks.tables, True)])[0]
        diff = (logits - hf_last_logits(hf_model, ids)).abs().max().item()
        print(f"paged prefill of {n} tokens: max |diff| vs HF = {diff:.2e}")
        assert diff < LOGITS_ATOL
        manager.release(blocks)


def prefill_prompts(runner: ModelRunner, manager: KVCacheManager, tokenizer,
                    lengths: list[int], first_seed: int, room: int = 3,
                    ) -> tuple[list[list[int]], list[SequenceBlocks]]:
    """Prefill real-text prompts of these lengths one by one, each with blocks for `room`
    more tokens; their token ids and blocks (sliding-window groups already without the
    blocks their window has left behind)."""
    seqs, held = [], []
    for i, n in enumerate(lengths):
        ids = prompt_ids(tokenizer, n, seed=first_seed + i)
        blocks = SequenceBlocks()
        assert manager.allocate_slots(blocks, n + room)
        runner.compute_logits([SequenceStep(ids, 0, blocks.tables, True)])
        manager.cache_full_blocks(blocks, ids, n)
        manager.free_left_behind(blocks, n)
        seqs.append(ids)
        held.append(blocks)
    return seqs, held


def check_paged_decode(runner: ModelRunner, manager: KVCacheManager, hf, tokenizer,
                       lengths: list[int], label: str, first_seed: int = 100) -> None:
    """Prefill prompts of these lengths one by one, then decode them as one batch for 3
    steps; every step's logits must equal Hugging Face's on the same tokens."""
    seqs, held = prefill_prompts(runner, manager, tokenizer, lengths, first_seed)
    for step in range(3):
        new_tokens = [1000 + 7 * step + i for i in range(len(seqs))]
        batch = [SequenceStep([tok], len(ids), blocks.tables, True)
                 for tok, ids, blocks in zip(new_tokens, seqs, held)]
        logits = runner.compute_logits(batch)
        for i, tok in enumerate(new_tokens):
            seqs[i] = [*seqs[i], tok]
            manager.free_left_behind(held[i], len(seqs[i]))
            diff = (logits[i] - hf_last_logits(hf, seqs[i])).abs().max().item()
            print(f"{label} decode step {step}, {len(seqs[i])} tokens: max |diff| = {diff:.2e}")
            assert diff < LOGITS_ATOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_decode_batch_of_different_lengths_matches_hf(model, hf_model, tokenizer, backend):
    runner, manager = make_runner(model, backend=backend)
    check_paged_decode(runner, manager, hf_model, tokenizer, [3, 17, 30, 48, 9], backend)


def two_prompts(runner: ModelRunner, manager: KVCacheManager, tokenizer, shared_tokens: int,
                seed: int) -> tuple[list[int], SequenceBlocks, SequenceBlocks]:
    """Two prompts that share `shared_tokens` real-text tokens: the first computed (its full
    blocks cached), and the second's blocks as the prefix cache finds them, with the
    second's tokens."""
    shared = prompt_ids(tokenizer, shared_tokens, seed=seed)
    first = [*shared, *tokenizer(" and the first user asks about cats").input_ids]
    second = [*shared, *tokenizer(" while the second one wants dogs, please").input_ids]
    a = SequenceBlocks()
    assert manager.allocate_slots(a, len(first))
    runner.compute_logits([SequenceStep(first, 0, a.tables, True)])
    manager.cache_full_blocks(a, first, len(first))
    return second, a, manager.find_cached_prefix(second)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_hit_computes_only_the_rest_and_matches_hf(model, hf_model, tokenizer, backend):
    runner, manager = make_runner(model, backend=backend)
    second, _, b = two_prompts(runner, manager, tokenizer, 3 * BLOCK_SIZE, seed=7)
    cached = len(b.block_table) * BLOCK_SIZE
    assert cached == 3 * BLOCK_SIZE
    assert manager.allocate_slots(b, len(second), new_prefix_hit=True)
    logits = runner.compute_logits([SequenceStep(second[cached:], cached, b.tables, True)])[0]
    diff = (logits - hf_last_logits(hf_model, second)).abs().max().item()
    print(f"prefix hit: {cached} cached tokens reused, {len(second) - cached} computed; "
          f"max |diff| vs HF = {diff:.2e}")
    assert diff < LOGITS_ATOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copied_partial_block_serves_the_shared_tokens(model, hf_model, tokenizer, backend):
    """A prompt sharing 2.5 blocks with a computed one: the 2 whole blocks from the cache,
    the half block from a copy of the other's block (kvcache's partial_from); only the rest
    is computed, and the logits are Hugging Face's."""
    runner, manager = make_runner(model, backend=backend)
    reused = 2 * BLOCK_SIZE + BLOCK_SIZE // 2
    second, a, b = two_prompts(runner, manager, tokenizer, reused, seed=11)
    assert len(b.block_table) == 2
    assert manager.allocate_slots(b, len(second), new_prefix_hit=True, partial_from=a)
    copies = manager.take_block_copies()
    assert copies == [(a.block_table[2], b.block_table[2])]
    runner.pool.copy_blocks(copies)
    logits = runner.compute_logits([SequenceStep(second[reused:], reused, b.tables, True)])[0]
    diff = (logits - hf_last_logits(hf_model, second)).abs().max().item()
    print(f"{reused} tokens reused (8 from a copied block), {len(second) - reused} computed; "
          f"max |diff| vs HF = {diff:.2e}")
    assert diff < LOGITS_ATOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_matches_hf(model, hf_model, tokenizer, backend):
    runner, manager = make_runner(model, backend=backend)
    ids = prompt_ids(tokenizer, 45, seed=3)
    blocks = SequenceBlocks()
    assert manager.allocate_slots(blocks, len(ids))
    pos = 0
    for size in (13, 20, 12):  # chunk edges fall inside blocks on purpose
        last = pos + size == len(ids)
        chunk = SequenceStep(ids[pos:pos + size], pos, blocks.tables, last)
        out = runner.compute_logits([chunk])
        pos += size
    diff = (out[0] - hf_last_logits(hf_model, ids)).abs().max().item()
    print(f"45 tokens prefilled in chunks of 13/20/12: max |diff| vs HF = {diff:.2e}")
    assert diff < LOGITS_ATOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_garbage_in_unused_slots_is_masked_out(model, tokenizer, backend):
    """Unused and stale slots hold whatever was there before. Fill the pool with huge
    finite values: masking must give them exactly zero weight. (Not NaN: softmax weight 0
    times NaN is still NaN, so no mask could hide it; a real pool never holds NaN, since
    every slot was either zeroed at start or written with a real K/V.)"""
    clean, manager = make_runner(model, backend=backend)
    dirty, _ = make_runner(model, backend=backend)
    for layer in range(model.cfg.num_layers):
        for t in (dirty.pool.k[layer], dirty.pool.v[layer]):
            t.uniform_(-1e30, 1e30)
    ids_a, ids_b = prompt_ids(tokenizer, 20, 1), prompt_ids(tokenizer, 7, 2)
    a, b = SequenceBlocks(), SequenceBlocks()
    assert manager.allocate_slots(a, 21)
    assert manager.allocate_slots(b, 8)
    results = []
    for runner in (clean, dirty):
        runner.compute_logits([SequenceStep(ids_a, 0, a.tables, True),
                    SequenceStep(ids_b, 0, b.tables, True)])
        results.append(runner.compute_logits([SequenceStep([42], 20, a.tables, True),
                                   SequenceStep([43], 7, b.tables, True)]))
    diff = (results[0] - results[1]).abs().max().item()
    print(f"{backend}: clean pool vs pool full of +-1e30 garbage: max |diff| = {diff:.2e}")
    assert torch.isfinite(results[1]).all()
    assert diff < LOGITS_ATOL


def test_windowed_chunk_gathers_from_the_window_and_matches_causal_attention():
    """A chunk after cached tokens, in a sliding-window layer: only the blocks the window
    reaches are gathered, and the result equals windowed causal attention over the whole
    sequence (the first 37 tokens written by an earlier chunk)."""
    from model.layers import causal_attention

    torch.manual_seed(4)
    window, n, cached = 12, 60, 37
    pool = KVCachePool(num_layers=1, num_blocks=8, num_kv_heads=1, head_dim=32)
    attention = TorchPagedAttention(pool)
    table = [3, 1, 6, 2]
    q, k, v = torch.randn(n, 4, 32), torch.randn(n, 1, 32), torch.randn(n, 1, 32)
    attention.step = StepMetadata.build([], [(table, cached, cached)])
    attention(0, q[:cached], k[:cached], v[:cached], window=window)
    attention.step = StepMetadata.build([], [(table, n, n - cached)])
    out = attention(0, q[cached:], k[cached:], v[cached:], window=window)
    first_block, mask = attention.step.chunks[0].window_keys(window, torch.float32)
    assert first_block == (cached - window + 1) // BLOCK_SIZE == 1
    assert mask.shape == (n - cached, n - BLOCK_SIZE)
    expected = causal_attention(0, q[None], k[None], v[None], window=window)[0, cached:]
    diff = (out - expected).abs().max().item()
    print(f"windowed chunk from block {first_block}: max |diff| vs causal = {diff:.2e}")
    assert diff < 1e-5
