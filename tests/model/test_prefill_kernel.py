"""The compiled CPU prefill-attention kernel against the PyTorch gather + SDPA path."""

from __future__ import annotations

import pytest
import torch

from kvcache.pool import BLOCK_SIZE, KVCachePool
from model.attention import StepMetadata, TorchPagedAttention
from model.kernels.build import load_cpu_kernels, load_paged_prefill_attention

kernel = load_paged_prefill_attention()
pytestmark = pytest.mark.skipif(kernel is None, reason="no C++ toolchain to build the kernel")


def filled_pool(kv_heads: int, head_dim: int, tokens: int, seed: int,
                dtype: torch.dtype = torch.float32) -> tuple[KVCachePool, list[int]]:
    """A one-layer pool of random K/V and a scattered block table covering `tokens` (block 0,
    the dummy, never used); every slot past the context holds huge garbage."""
    torch.manual_seed(seed)
    used = -(-tokens // BLOCK_SIZE)
    pool = KVCachePool(num_layers=1, num_blocks=used + 3, num_kv_heads=kv_heads,
                       head_dim=head_dim, dtype=dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    table = torch.randperm(used + 2)[:used].add(1).tolist()
    pool.k[0][table[-1], tokens - (used - 1) * BLOCK_SIZE:] = 1e30
    pool.v[0][table[-1], tokens - (used - 1) * BLOCK_SIZE:] = -1e30
    return pool, table


def both_paths(pool: KVCachePool, table: list[int], cached: int, length: int, heads: int,
               window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output and the gather + SDPA path's for a chunk of `length` rows after
    `cached` tokens; the chunk's own K/V are random and written by the step itself."""
    kv_heads, dim = pool.k[0].shape[2:]
    dtype = pool.k[0].dtype
    q = torch.randn(length, heads, dim).to(dtype)
    k, v = (torch.randn(length, kv_heads, dim).to(dtype) for _ in range(2))
    reference = TorchPagedAttention(pool)
    reference.step = StepMetadata.build([], [(table, cached + length, length)], dtype=dtype)
    expected = reference(0, q, k, v, window=window)  # writes k, v into the pool first
    chunk = reference.step.chunks[0]
    ours = kernel(q, pool.k[0], pool.v[0], chunk.block_table, chunk.context_len, dim ** -0.5,
                  window or 0)
    return ours, expected


@pytest.mark.parametrize("cached", [0, 5, 16, 37])
@pytest.mark.parametrize("length", [1, 2, 5, 15, 30, 40, 42, 130])
def test_kernel_matches_gather_path_with_and_without_a_cached_prefix(cached, length):
    """SmolLM2's shape (9 query heads on 3 K/V heads, head dim 64); chunks of 1 row up to
    past a task's tile of rows, edges inside blocks."""
    pool, table = filled_pool(3, 64, cached + length, seed=cached * 1000 + length)
    ours, expected = both_paths(pool, table, cached, length, heads=9)
    diff = (ours - expected).abs().max().item()
    print(f"{length} rows after {cached} cached: max |diff| = {diff:.2e}")
    assert torch.isfinite(ours).all()
    assert diff < 1e-5


def test_kernel_handles_many_heads_and_odd_head_dim():
    """66 query heads on 3 K/V heads (a group of 22 rows per position), head dim 80 (not a
    multiple of the kernel's 16-float vectors)."""
    pool, table = filled_pool(3, 80, 90, seed=5)
    ours, expected = both_paths(pool, table, 40, 50, heads=66)
    diff = (ours - expected).abs().max().item()
    print(f"66 heads, head dim 80: max |diff| = {diff:.2e}")
    assert diff < 1e-5


@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_fills_every_row_of_a_32_row_task(threads):
    """8 query heads on 2 K/V heads and 8 positions: one task of 32 rows per K/V head on 1 or 2
    threads, whose last 2 rows fall past the V sum's whole blocks of 6 (AVX-512)."""
    pool, table = filled_pool(2, 64, 48, seed=9)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours, expected = both_paths(pool, table, 40, 8, heads=8)
    finally:
        torch.set_num_threads(before)
    diff = (ours - expected).abs().max().item()
    print(f"8 heads on 2, 8 rows after 40 cached, {threads} thread(s): max |diff| = {diff:.2e}")
    assert diff < 1e-5


@pytest.mark.parametrize("cached,length", [(0, 60), (37, 23), (300, 100), (20, 1)])
def test_kernel_window_reads_only_the_window(cached, length):
    """Sliding-window chunks (Gemma 3's shape: head dim 256, one K/V head). Keys older than
    every row's window hold huge garbage, which the kernel must never read."""
    window = 40
    pool, table = filled_pool(1, 256, cached + length, seed=cached + length)
    for pos in range(max(0, cached - window + 1)):  # older than the first row's window
        pool.k[0][table[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = 1e30
        pool.v[0][table[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = -1e30
    torch.manual_seed(9)
    ours, expected = both_paths(pool, table, cached, length, heads=4, window=window)
    diff = (ours - expected).abs().max().item()
    print(f"window {window}, {length} rows after {cached}: max |diff| = {diff:.2e}")
    assert torch.isfinite(ours).all()
    assert diff < 1e-5


def test_bf16_kernel_matches_the_fp32_path_on_the_same_values():
    """bf16 q/K/V are widened exactly to fp32 inside the kernel; only the output is rounded
    to bf16 once: relative 2**-8 of the largest output."""
    cached, length = 37, 40
    pool, table = filled_pool(3, 64, cached + length, seed=11, dtype=torch.bfloat16)
    wide = KVCachePool(num_layers=1, num_blocks=pool.k[0].shape[0], num_kv_heads=3, head_dim=64)
    q = torch.randn(length, 9, 64).to(torch.bfloat16)
    k, v = (torch.randn(length, 3, 64).to(torch.bfloat16) for _ in range(2))
    step = StepMetadata.build([], [(table, cached + length, length)])
    TorchPagedAttention.write(pool.k[0], pool.v[0], k, v, step)
    wide.k[0].copy_(pool.k[0])
    wide.v[0].copy_(pool.v[0])
    reference = TorchPagedAttention(wide)
    reference.step = step
    expected = reference(0, q.float(), k.float(), v.float())
    ours = kernel(q, pool.k[0], pool.v[0], step.chunks[0].block_table, cached + length,
                  64 ** -0.5, 0)
    diff = (ours.float() - expected).abs().max().item()
    bound = expected.abs().max().item() * 2**-8
    print(f"bf16 kernel vs fp32 gather path: max |diff| = {diff:.2e} (bound {bound:.2e})")
    assert ours.dtype == torch.bfloat16 and diff <= bound


def test_kernel_keeps_sharp_softmaxes_exact():
    """Queries scaled up so a row's scores span hundreds: most weights are far below fp32's
    smallest normal relative to the largest (the kernel's exp gives them 0), the rest must
    still match SDPA's softmax."""
    pool, table = filled_pool(3, 64, 100, seed=21)
    kv_heads, dim = 3, 64
    torch.manual_seed(22)
    q = torch.randn(60, 9, dim) * 40
    k, v = (torch.randn(60, kv_heads, dim) for _ in range(2))
    reference = TorchPagedAttention(pool)
    reference.step = StepMetadata.build([], [(table, 100, 60)])
    expected = reference(0, q, k, v)
    ours = kernel(q, pool.k[0], pool.v[0], reference.step.chunks[0].block_table, 100,
                  dim ** -0.5, 0)
    diff = (ours - expected).abs().max().item()
    print(f"sharp softmax: max |diff| = {diff:.2e}")
    assert diff < 1e-5


@pytest.mark.parametrize("length", [14, 30, 130])
def test_kernel_gives_the_same_bits_on_one_thread_and_two(length):
    """How the chunk's rows are cut into tasks depends on the threads; each row's sums must
    not."""
    pool, table = filled_pool(3, 64, 40 + length, seed=length)
    q = torch.randn(length, 9, 64)
    block_table = torch.tensor(table)
    threads = torch.get_num_threads()
    try:
        outputs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outputs.append(kernel(q, pool.k[0], pool.v[0], block_table, 40 + length, 0.125, 0))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outputs[0], outputs[1])


def test_kernel_rejects_bad_tables():
    """A block id outside the pool, or a context longer than its table, is a Python error,
    not a crash."""
    pool, _ = filled_pool(3, 64, 20, seed=1)
    q = torch.randn(4, 9, 64)
    with pytest.raises(RuntimeError, match="outside the pool"):
        kernel(q, pool.k[0], pool.v[0], torch.tensor([1, 70]), 20, 0.125, 0)
    with pytest.raises(RuntimeError, match="outside its block table"):
        kernel(q, pool.k[0], pool.v[0], torch.tensor([1]), 20, 0.125, 0)


def test_engine_routes_chunks_through_the_kernel(model):
    from engine.model_runner import ModelRunner
    from model.attention import CpuKernelAttention

    pool = KVCachePool(model.cfg.num_layers, 8, model.cfg.num_kv_heads, model.cfg.head_dim)
    attention = ModelRunner(model, pool, "auto").attention
    assert isinstance(attention, CpuKernelAttention) and attention.prefill_kernel is not None


def test_bf16_chunks_with_enough_work_take_sdpa_where_it_runs_on_amx():
    """With amx_sdpa, chunks of at least 16 rows seeing at least 8,192 (query, key) pairs take
    gather + SDPA (the very same output as that path); others take the kernel. Without it,
    every chunk takes the kernel. Only a bf16 pool on a CPU with AMX turns it on."""
    from model.attention import CpuKernelAttention, create_backend
    from model.kernels.build import load_paged_decode_attention

    pool, table = filled_pool(3, 64, 700, seed=7, dtype=torch.bfloat16)
    routed = CpuKernelAttention(pool, load_paged_decode_attention(), kernel, amx_sdpa=True)
    plain = CpuKernelAttention(pool, load_paged_decode_attention(), kernel)
    for cached, length, sdpa in [(0, 512, True), (660, 30, True), (0, 128, True),
                                 (200, 30, False), (0, 64, False), (690, 8, False)]:
        step = StepMetadata.build([], [(table, cached + length, length)], dtype=torch.bfloat16)
        assert routed.chunk_takes_sdpa(step.chunks[0]) is sdpa, (cached, length)
        assert not plain.chunk_takes_sdpa(step.chunks[0])
    for cached, length in [(660, 30), (200, 30)]:
        q = torch.randn(length, 9, 64).to(torch.bfloat16)
        k, v = (torch.randn(length, 3, 64).to(torch.bfloat16) for _ in range(2))
        outs = {}
        for name, backend in [("routed", routed), ("kernel", plain),
                              ("sdpa", TorchPagedAttention(pool))]:
            backend.step = StepMetadata.build([], [(table, cached + length, length)],
                                              dtype=torch.bfloat16)
            outs[name] = backend(0, q, k, v)
        same = "sdpa" if routed.chunk_takes_sdpa(routed.step.chunks[0]) else "kernel"
        assert torch.equal(outs["routed"], outs[same]), (cached, length)
        assert not torch.equal(outs["kernel"], outs["sdpa"])  # so the check above can fail
    fp32_pool, _ = filled_pool(3, 64, 16, seed=0)
    assert not create_backend("auto", fp32_pool).amx_sdpa
    assert create_backend("auto", pool).amx_sdpa is load_cpu_kernels().tuning.dense_amx_usable()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 20])
def test_a_steps_chunks_in_one_call_give_each_chunk_its_own_bits(dtype, window):
    """A step of 2 one-token rows and 5 chunks (some sharing their first blocks, as users of
    one system prompt do; 1 to 130 rows, 0 to 70 cached) in one call of the kernel that takes
    them all: bit for bit each chunk's output from a call of its own, and within fp32's
    tolerance of gather + SDPA; with and without a sliding window."""
    from model.attention import CpuKernelAttention
    from model.kernels.build import load_paged_decode_attention, load_paged_prefill_attention_chunks

    pool = KVCachePool(num_layers=1, num_blocks=60, num_kv_heads=3, head_dim=64, dtype=dtype)
    torch.manual_seed(3)
    pool.k[0].normal_()
    pool.v[0].normal_()
    shared = [5, 9, 2, 7, 11]  # 80 tokens of a prefix
    tables = [[*shared, 20, 21], [*shared, 22, 23], list(range(30, 40)), [*shared[:2], 41],
              list(range(42, 52)), [12, 13], [14]]
    single = [(tables[5], 25), (tables[6], 9)]
    chunks = [(tables[0], 100, 30), (tables[1], 95, 25), (tables[2], 130, 130),
              (tables[3], 33, 1), (tables[4], 70 + 14, 14)]
    rows = len(single) + sum(n for _, _, n in chunks)
    q = torch.randn(rows, 9, 64).to(dtype)
    k, v = (torch.randn(rows, 3, 64).to(dtype) for _ in range(2))
    decode = load_paged_decode_attention()
    batched = CpuKernelAttention(pool, decode, kernel,
                                 chunks_kernel=load_paged_prefill_attention_chunks())
    one_by_one = CpuKernelAttention(pool, decode, kernel)
    outs = {}
    for name, backend in [("batched", batched), ("one by one", one_by_one),
                          ("sdpa", TorchPagedAttention(pool))]:
        backend.step = backend.build_metadata(single, chunks)
        outs[name] = backend(0, q, k, v, window=window)
    assert batched.step.chunk_batch is not None and one_by_one.step.chunk_batch is None
    assert torch.equal(outs["batched"], outs["one by one"])
    diff = (outs["batched"].float() - outs["sdpa"].float()).abs().max().item()
    assert diff < (1e-5 if dtype == torch.float32 else 2e-2), diff


def test_the_chunks_call_rejects_bad_chunks():
    """A chunk whose rows fall outside q or overlap another's, or tensors of different
    lengths, are a Python error, not a crash."""
    from model.kernels.build import load_paged_prefill_attention_chunks

    chunks_kernel = load_paged_prefill_attention_chunks()
    pool, table = filled_pool(3, 64, 40, seed=2)
    q = torch.randn(10, 9, 64)
    tables = torch.tensor([table, table])

    def call(starts, lengths, context_lens=(20, 40)):
        return chunks_kernel(q, pool.k[0], pool.v[0], tables, torch.tensor(context_lens),
                             torch.tensor(starts), torch.tensor(lengths), 0.125, 0)

    assert call([0, 4], [4, 6]).shape == q.shape
    assert call([4, 0], [6, 4]).shape == q.shape  # any order
    with pytest.raises(RuntimeError, match="rows outside q"):
        call([0, 4], [4, 7])
    with pytest.raises(RuntimeError, match="share rows"):
        call([4, 0], [6, 5])
    with pytest.raises(RuntimeError, match="one table, context length"):
        call([0], [4, 6])
    with pytest.raises(RuntimeError, match="outside its block table"):
        call([0, 4], [4, 6], context_lens=(20, 90))
