"""The compiled CPU decode-attention kernel against the PyTorch gather + SDPA path."""

from __future__ import annotations

import pytest
import torch

from kvcache.pool import BLOCK_SIZE, KVCachePool
from model.attention import StepMetadata, TorchPagedAttention
from model.kernels.build import load_paged_decode_attention

kernel = load_paged_decode_attention()
pytestmark = pytest.mark.skipif(kernel is None, reason="no C++ toolchain to build the kernel")


def kernel_and_reference(pool: KVCachePool, step: StepMetadata,
                         q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output and the gather + SDPA path's, for the same one-token batch."""
    reference = TorchPagedAttention(pool).attend_single(q, pool.k[0], pool.v[0], step)
    ours = kernel(q, pool.k[0], pool.v[0], step.single_block_tables, step.single_context_lens,
                  q.shape[-1] ** -0.5)
    return ours, reference


def test_kernel_matches_gather_path_and_ignores_garbage():
    torch.manual_seed(0)
    pool = KVCachePool(num_layers=1, num_blocks=40, num_kv_heads=3, head_dim=64)
    pool.k[0].normal_()
    pool.v[0].normal_()
    lengths = [1, 15, 16, 17, 70, 33]
    perm = torch.randperm(39).add(1).tolist()  # blocks scattered over the pool, never block 0
    tables, start = [], 0
    for n in lengths:
        used = -(-n // BLOCK_SIZE)
        tables.append(perm[start:start + used])
        start += used
    # Slots past each sequence's length hold huge garbage; neither path may look at them.
    for table, n in zip(tables, lengths):
        last = table[-1]
        pool.k[0][last, n % BLOCK_SIZE or BLOCK_SIZE:] = 1e30
        pool.v[0][last, n % BLOCK_SIZE or BLOCK_SIZE:] = -1e30
    step = StepMetadata.build(list(zip(tables, lengths)), [])
    ours, reference = kernel_and_reference(pool, step, torch.randn(len(lengths), 9, 64))
    diff = (ours - reference).abs().max().item()
    print(f"kernel vs gather + SDPA over lengths {lengths}: max |diff| = {diff:.2e}")
    assert torch.isfinite(ours).all()
    assert diff < 1e-5


def test_engine_uses_the_kernel_on_cpu_fp32(model):
    from engine.model_runner import ModelRunner
    from model.attention import CpuKernelAttention

    pool = KVCachePool(model.cfg.num_layers, 8, model.cfg.num_kv_heads, model.cfg.head_dim)
    assert ModelRunner(model, pool, "auto").attention_backend == "cpu-kernel"
    assert isinstance(ModelRunner(model, pool, "auto").attention, CpuKernelAttention)
    assert not isinstance(ModelRunner(model, pool, "torch").attention, CpuKernelAttention)


def test_kernel_handles_many_heads_and_rejects_bad_tables():
    """Shapes other than SmolLM2's: 66 query heads on 3 K/V heads, head dim 80; and a block
    id outside the pool is a Python error, not a crash."""
    torch.manual_seed(1)
    pool = KVCachePool(num_layers=1, num_blocks=10, num_kv_heads=3, head_dim=80)
    pool.k[0].normal_()
    pool.v[0].normal_()
    step = StepMetadata.build([([3, 7, 1], 40), ([9], 5)], [])
    q = torch.randn(2, 66, 80)
    ours, reference = kernel_and_reference(pool, step, q)
    diff = (ours - reference).abs().max().item()
    print(f"66 heads, head dim 80: max |diff| = {diff:.2e}")
    assert diff < 1e-5
    bad = StepMetadata.build([([3, 70], 20)], [])
    with pytest.raises(RuntimeError, match="outside the pool"):
        kernel(q[:1], pool.k[0], pool.v[0], bad.single_block_tables, bad.single_context_lens, 0.1)


@pytest.mark.parametrize("head_dim", [64, 128, 256, 80])
def test_bf16_kernel_matches_the_fp32_path_on_the_same_values(head_dim):
    """bf16 K/V/q are widened exactly to fp32 inside the kernel; only the output is rounded to
    bf16 once, so the error is that one rounding: relative 2**-8 of the largest output. Head
    dims 64, 128 and 256 run the AVX-512 body (rows widened as even and odd values, the output
    put back in order), 80 the plain loop."""
    torch.manual_seed(2)
    pool = KVCachePool(num_layers=1, num_blocks=20, num_kv_heads=3, head_dim=head_dim,
                       dtype=torch.bfloat16)
    pool.k[0].normal_()
    pool.v[0].normal_()
    step = StepMetadata.build([([3, 7, 1], 40), ([9], 5), ([11, 12, 13, 14, 15], 77)], [])
    q = torch.randn(3, 9, head_dim).to(torch.bfloat16)
    ours = kernel(q, pool.k[0], pool.v[0], step.single_block_tables, step.single_context_lens,
                  head_dim ** -0.5)
    wide = KVCachePool(num_layers=1, num_blocks=20, num_kv_heads=3, head_dim=head_dim)
    wide.k[0].copy_(pool.k[0])
    wide.v[0].copy_(pool.v[0])
    reference = TorchPagedAttention(wide).attend_single(q.float(), wide.k[0], wide.v[0], step)
    diff = (ours.float() - reference).abs().max().item()
    bound = reference.abs().max().item() * 2**-8
    print(f"bf16 kernel vs fp32 gather path, head dim {head_dim}: max |diff| = {diff:.2e} "
          f"(bound {bound:.2e})")
    assert ours.dtype == torch.bfloat16 and diff <= bound


def test_kernel_window_reads_only_the_last_tokens():
    """Sliding-window decode (Gemma 3's shape: head dim 256, one K/V head): each sequence
    attends to its last `window` tokens only. The keys before the window hold huge garbage,
    which the kernel must never read; lengths cross the kernel's 256-token parts."""
    torch.manual_seed(3)
    window = 40
    pool = KVCachePool(num_layers=1, num_blocks=64, num_kv_heads=1, head_dim=256)
    pool.k[0].normal_()
    pool.v[0].normal_()
    lengths = [5, 40, 41, 300, 530]
    tables, start = [], 1
    for n in lengths:
        used = -(-n // BLOCK_SIZE)
        tables.append(list(range(start, start + used)))
        start += used
    for table, n in zip(tables, lengths):
        for pos in range(max(0, n - window)):  # everything the window has left behind
            block, offset = table[pos // BLOCK_SIZE], pos % BLOCK_SIZE
            pool.k[0][block, offset] = 1e30
            pool.v[0][block, offset] = -1e30
    step = StepMetadata.build(list(zip(tables, lengths)), [])
    q = torch.randn(len(lengths), 4, 256)
    ours = kernel(q, pool.k[0], pool.v[0], step.single_block_tables, step.single_context_lens,
                  256 ** -0.5, window)
    reference = TorchPagedAttention(pool).attend_single(q, pool.k[0], pool.v[0], step, window)
    diff = (ours - reference).abs().max().item()
    print(f"window {window}, lengths {lengths}: kernel vs masked gather, max |diff| = {diff:.2e}")
    assert torch.isfinite(ours).all() and torch.isfinite(reference).all()
    assert diff < 1e-5
    whole = kernel(q, pool.k[0], pool.v[0], step.single_block_tables, step.single_context_lens,
                   256 ** -0.5)
    assert not torch.isfinite(whole[-1]).all() or (whole[-1] - ours[-1]).abs().max() > 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_rows_apart_give_the_same_bits(dtype):
    """q as the decode stack passes it: the Q part of a QKV output, rows 960 values apart.
    The output is the same, bit for bit, as for a contiguous copy, and in q's dtype."""
    torch.manual_seed(4)
    pool = KVCachePool(num_layers=1, num_blocks=20, num_kv_heads=3, head_dim=64, dtype=dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    step = StepMetadata.build([([3, 7, 1], 40), ([9], 5), ([11, 12, 13, 14, 15], 77)], [])
    qkv = torch.randn(3, 15 * 64).to(dtype)
    q = qkv[:, :9 * 64].view(3, 9, 64)
    assert not q.is_contiguous()
    args = (pool.k[0], pool.v[0], step.single_block_tables, step.single_context_lens, 0.125)
    apart, packed = kernel(q, *args), kernel(q.contiguous(), *args)
    assert apart.dtype == dtype and apart.shape == (3, 9, 64)
    assert torch.equal(apart, packed)
