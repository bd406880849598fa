"""Gemma 3 270M's shapes through every kernel, against the PyTorch paths.

Gemma's attention is unlike SmolLM2's: 4 query heads on one K/V head of dim 256 (a group of
4 rows per position), a 512-token sliding window on five layers of six. A prefill chunk is
cut into tasks by those numbers and the thread count, so every chunk length up to the step
budget and past the window is run on 1, 2 and 3 threads (391 positions on 2 threads once
cut a tile of negative size: std::terminate killed the engine). The matmuls run at the
model's own widths, the LM head's 262,144 outputs included, on each path of the matmul
kernels this machine can take. tests/model/test_emulated_cpus.py runs this file again
as on CPUs without AVX512_BF16 and AMX, and without AVX-512.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from kvcache.pool import BLOCK_SIZE, KVCachePool
from model.attention import StepMetadata, TorchPagedAttention
from model.dense_linear import PackedLinear
from model.gguf.codes import block_tensor
from model.kernels.build import load_paged_decode_attention, load_paged_prefill_attention
from tests.model.conftest import BF16_PATHS, PATHS, needs_bf16, needs_fp32
from tests.model.test_dense_linear import check_bf16, check_fp32, inputs, rows
from tests.model.test_gguf_codes import random_raw
from tests.model.test_prefill_kernel import both_paths, filled_pool
from tests.model.test_q4_1 import check_against_reference, kernel_or_skip

torch.set_grad_enabled(False)

HEADS, KV_HEADS, HEAD_DIM, WINDOW = 4, 1, 256, 512
HIDDEN, INTERMEDIATE, VOCAB = 640, 2048, 262_144
# (K, N) of each matmul: fused q/k/v, o, fused gate/up, down.
LAYER_SHAPES = [(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM), (HEADS * HEAD_DIM, HIDDEN),
                (HIDDEN, 2 * INTERMEDIATE), (INTERMEDIATE, HIDDEN)]
ATOL = 1e-5  # fp32 attention: two fp32 sums in different orders

prefill = load_paged_prefill_attention()
decode = load_paged_decode_attention()
needs_attention = pytest.mark.skipif(prefill is None, reason="no C++ toolchain for the kernels")


@contextmanager
def on_threads(threads: int) -> Iterator[None]:
    """Run the block on `threads` OpenMP threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@needs_attention
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("window", [WINDOW, 0])
def test_prefill_chunks_of_every_cut(threads, window):
    """Chunk lengths whose cut into tiles of 16 positions comes out uneven, after no cache
    and after a cached prefix longer than the window."""
    lengths = [1, 15, 17, 33, 225, 271, 301, 391, 417, 512]
    worst = 0.0
    with on_threads(threads):
        for cached in (0, 600):
            for length in lengths:
                pool, table = filled_pool(KV_HEADS, HEAD_DIM, cached + length,
                                          seed=cached + length)
                torch.manual_seed(length)
                ours, expected = both_paths(pool, table, cached, length, heads=HEADS,
                                            window=window or None)
                assert torch.isfinite(ours).all(), (cached, length)
                worst = max(worst, (ours - expected).abs().max().item())
    print(f"window {window}, {threads} thread(s), lengths {lengths} after 0 and 600: "
          f"max |diff| = {worst:.2e}")
    assert worst < ATOL


@needs_attention
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_batch_across_the_window(threads):
    """A decode step of sequences shorter and longer than the window, on each thread count."""
    torch.manual_seed(threads)
    lengths = [1, 17, 511, 512, 513, 926, 1500]
    pool = KVCachePool(num_layers=1, num_blocks=sum(-(-n // BLOCK_SIZE) for n in lengths) + 1,
                       num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    pool.k[0].normal_()
    pool.v[0].normal_()
    tables, start = [], 1
    for n in lengths:
        used = -(-n // BLOCK_SIZE)
        tables.append(list(range(start, start + used)))
        start += used
    step = StepMetadata.build(list(zip(tables, lengths)), [])
    q = torch.randn(len(lengths), HEADS, HEAD_DIM)
    with on_threads(threads):
        for window in (WINDOW, 0):
            ours = decode(q, pool.k[0], pool.v[0], step.single_block_tables,
                          step.single_context_lens, HEAD_DIM ** -0.5, window)
            expected = TorchPagedAttention(pool).attend_single(q, pool.k[0], pool.v[0], step,
                                                               window or None)
            diff = (ours - expected).abs().max().item()
            print(f"decode, window {window}, {threads} thread(s): max |diff| = {diff:.2e}")
            assert diff < ATOL


@needs_fp32
@pytest.mark.parametrize(("k", "n"), LAYER_SHAPES)
def test_layer_matmuls_fp32(k, n, path):
    w = inputs(1, k, n, torch.float32)[1]
    layer = PackedLinear(w)
    for m in (1, 4, 30, 391):
        x = rows(m, k, torch.float32, seed=m)
        check_fp32(layer(x), x, w)


@needs_bf16
@pytest.mark.parametrize(("k", "n"), LAYER_SHAPES)
@pytest.mark.parametrize("path", BF16_PATHS, indirect=True)
def test_layer_matmuls_bf16(k, n, path):
    w = inputs(1, k, n, torch.bfloat16)[1]
    layer = PackedLinear(w)
    for m in (1, 4, 30, 391):
        x = rows(m, k, torch.bfloat16, seed=m)
        check_bf16(layer(x), x, w)


@needs_fp32
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_lm_head(dtype, path):
    """262,144 outputs from 640 inputs, for a decode row and a few."""
    w = (torch.randn(HIDDEN, VOCAB, generator=torch.Generator().manual_seed(1))
         * HIDDEN ** -0.5).to(dtype)
    layer = PackedLinear(w)
    for m in (1, 5):
        x = rows(m, HIDDEN, dtype, seed=m)
        (check_fp32 if dtype == torch.float32 else check_bf16)(layer(x), x, w)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize(("k", "n"), LAYER_SHAPES)
def test_quantized_layer_matmuls(kind, k, n, quantized_path):
    """The file's own codes (Q4_K_M mixes these) at each layer width."""
    kernel_or_skip()
    weight = block_tensor(kind, torch.from_numpy(random_raw(kind, n, k, seed=n + k)))
    check_against_reference(weight, f"{kind} {k} -> {n}")
