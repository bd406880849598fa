"""Prefill attention per layer: gather + SDPA against the in-place CPU kernel.

One chunk of --chunk tokens after --cached tokens already in the paged pool, in the default
model's attention shape (9 query heads on 3 K/V heads, head dim 64, 30 layers). A step is
timed as the engine runs it: metadata built once, then every layer writes its K/V and
attends; the figure is the step's time divided by the layers, best of --repeats.

With --chunks N, the step holds N such chunks of different sequences whose cached tokens
are the same blocks (users of one system prompt), and the kernel's figure is given twice:
the chunks one call each, and all in one call (`paged_prefill_attention_chunks`, what the
engine runs).

    python3 benchmarks/studies/prefill_attention_microbench.py --cached 0 500 --chunk 16 512
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from kvcache.pool import BLOCK_SIZE, KVCachePool
from model.attention import CpuKernelAttention, TorchPagedAttention, create_backend

torch.set_grad_enabled(False)


def tables(cached: int, chunk: int, chunks: int) -> list[list[int]]:
    """Each chunk's block table: the cached prefix's blocks, the same for all, then its own
    (block 0, the dummy, never used)."""
    shared = -(-cached // BLOCK_SIZE)
    own = -(-(cached + chunk) // BLOCK_SIZE) - shared + 1
    first = shared + 1  # the first chunk's own first block
    return [list(range(1, first)) + list(range(first + c * own, first + (c + 1) * own))
            for c in range(chunks)]


def per_layer_ms(attention: TorchPagedAttention, cached: int, chunk: int, heads: int,
                 repeats: int, chunks: int = 1) -> float:
    pool = attention.pool
    layers = len(pool.k)
    kv_heads, dim = pool.k[0].shape[2:]
    dtype = pool.k[0].dtype
    step_chunks = [(table, cached + chunk, chunk) for table in tables(cached, chunk, chunks)]
    q = torch.randn(chunk * chunks, heads, dim).to(dtype)
    k, v = (torch.randn(chunk * chunks, kv_heads, dim).to(dtype) for _ in range(2))
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        attention.step = attention.build_metadata([], step_chunks)
        for layer in range(layers):
            attention(layer, q, k, v)
        best = min(best, time.perf_counter() - start)
    return best / layers * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cached", type=int, nargs="+", default=[0, 500])
    p.add_argument("--chunk", type=int, nargs="+", default=[16, 64, 512])
    p.add_argument("--dtype", choices=["float32", "bfloat16"], nargs="+",
                   default=["float32", "bfloat16"])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunks", type=int, default=1,
                   help="chunks per step, of different sequences sharing the cached blocks")
    args = p.parse_args()
    several = args.chunks > 1
    print("| dtype | cached | chunk | gather + SDPA (ms/layer) | in-place kernel (ms/layer) |"
          + (" kernel, one call for all chunks |" if several else ""))
    print("|---|---|---|---|---|" + ("---|" if several else ""))
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for cached in args.cached:
            for chunk in args.chunk:
                blocks = max(map(max, tables(cached, chunk, args.chunks))) + 1
                pool = KVCachePool(args.layers, blocks, args.kv_heads, args.head_dim, dtype=dtype)
                for t in (*pool.k, *pool.v):
                    t.normal_()
                kernel = create_backend("cpu-kernel", pool)
                assert isinstance(kernel, CpuKernelAttention) and kernel.prefill_kernel, \
                    "the CPU kernels could not be built here"
                one_by_one = CpuKernelAttention(pool, kernel.kernel, kernel.prefill_kernel,
                                                kernel.amx_sdpa)
                backends = [TorchPagedAttention(pool), one_by_one] + ([kernel] if several else [])
                figures = [per_layer_ms(backend, cached, chunk, args.heads, args.repeats,
                                        args.chunks) for backend in backends]
                print(f"| {dtype_name} | {cached} | {chunk} | "
                      + " | ".join(f"{f:.3f}" for f in figures) + " |")

if __name__ == "__main__":
    main()
