"""Our fp32 GEMM with its weight in cache against the same GEMM streaming the model's weights:
is a many-row pass held back by memory, or by the kernel's own arithmetic?

    python3 benchmarks/studies/gemm_in_cache.py [--rows 1 8 30 64 512] [--columns 512]

In cache: one weight of K = 576 and --columns columns per thread (512: 1.2 MB per thread,
inside a 2 MB L2; pick fewer where a core's L2 is smaller: `lscpu`), multiplied again and
again, so after the first call nothing comes from memory. With few columns a call is short
and OpenMP's start and join of each call weigh on the figure. Streamed:
benchmarks/model_matmuls.py's pass over all 30 layers' matmuls and the LM
head, every weight its own (538 MB). Both in GFLOP/s, best of --repeats, beside the FMA
instruction peak of the same threads (independent FMA chains on registers only, the kernel
module's dense_fma_peak): the most any fp32 GEMM could reach on this CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from benchmarks.model_matmuls import all_shapes, build, make_weights, pass_inputs, time_pass
from benchmarks.results import cpu_model
from model.dense_linear import PackedLinear, load_dense_linear

K = 576


def in_cache_gflops(rows: int, threads: int, columns: int, repeats: int) -> float:
    """GFLOP/s of x[rows, K] @ W[K, columns * threads], W hot in cache."""
    torch.set_num_threads(threads)
    n = columns * threads
    linear = PackedLinear(torch.randn(K, n) * K**-0.5, panel=64)
    x = torch.randn(rows, K)
    flop = 2.0 * rows * K * n
    calls = max(20, int(2e8 * threads / flop))  # ~5-10 ms a round
    for _ in range(calls):
        linear(x)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            linear(x)
        best = min(best, (time.perf_counter() - start) / calls)
    return flop / best / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 30, 64, 512])
    parser.add_argument("--columns", type=int, default=512,
                        help="weight columns per thread in the in-cache product")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    kernels = load_dense_linear()
    if kernels is None:
        print("our kernels do not build on this machine")
        return 1
    peak = {t: kernels.tuning.dense_fma_peak(t) for t in (1, 2)}
    weights = make_weights(torch.float32)
    passes = build("ours", weights)
    print(f"{cpu_model()}; fp32, our kernel; GFLOP/s, best of {args.repeats}; FMA instruction "
          f"peak {peak[1]:.0f} (1 thread), {peak[2]:.0f} (2 threads)\n")
    print("| rows | in cache, 1 thread | in cache, 2 threads | all the model's matmuls "
          "streamed, 2 threads |")
    print("|---|---|---|---|")
    for rows in args.rows:
        cached = [in_cache_gflops(rows, t, args.columns, args.repeats) for t in (1, 2)]
        torch.set_num_threads(2)
        seconds = time_pass(passes, pass_inputs(rows, torch.float32), args.repeats)
        streamed = sum(2.0 * rows * k * n for k, n in all_shapes()) / seconds / 1e9
        cells = [f"{g:.0f} ({g / peak[t] * 100:.0f}%)" for g, t in
                 ((cached[0], 1), (cached[1], 2), (streamed, 2))]
        print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
