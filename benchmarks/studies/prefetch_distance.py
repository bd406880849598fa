"""How far ahead the dense matmul kernel should prefetch, by row count: passes over all of
the default model's matmuls (benchmarks/model_matmuls.py) with each distance in turns.

    python3 benchmarks/studies/prefetch_distance.py --rows 1 4 8 30 --distances 16384 4096

The kernel (model/kernels/csrc/dense_linear.cpp) has two distances: one for rows that fit in one
row block (1-6 to 1-12 rows, by panel width), one for rows that need several. Both are set
to each distance in turn, round after round, so a drift of the machine lands on all of
them; printed per row count and distance: the median pass time and the median, over the
rounds, of its ratio to the first distance's pass in the same round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from benchmarks.model_matmuls import build, make_weights, pass_inputs, time_pass, weight_bytes
from benchmarks.results import cpu_model
from model.dense_linear import load_dense_linear

DEFAULT_ONE_BLOCK, DEFAULT_SEVERAL = 4096, 16384  # the kernel's own defaults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8, 30])
    parser.add_argument("--distances", nargs="+", type=int, default=[16384, 4096])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="passes per turn (best kept)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    kernels = load_dense_linear()
    if kernels is None:
        sys.exit("the dense kernel does not run on this CPU")
    print(f"{cpu_model()}, 2 threads, {args.rounds} rounds, best of {args.repeats} passes each")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        weights = make_weights(dtype)
        nbytes = weight_bytes(weights)
        fns = build("ours", weights)
        for rows in args.rows:
            inputs = pass_inputs(rows, dtype)
            times: dict[int, list[float]] = {d: [] for d in args.distances}
            for _ in range(args.rounds):
                for distance, passes in times.items():
                    kernels.tuning.set_prefetch_bytes(distance)
                    kernels.tuning.set_prefetch_one_block(distance)
                    passes.append(time_pass(fns, inputs, args.repeats))
            first = times[args.distances[0]]
            for distance, passes in times.items():
                ratio = statistics.median(a / b for a, b in zip(passes, first))
                best = statistics.median(passes)
                print(f"{name}, {rows} rows, prefetch {distance} B: {best * 1e3:.2f} ms a pass "
                      f"({nbytes / best / 1e9:.1f} GB/s), {ratio:.3f}x the "
                      f"{args.distances[0]} B pass", flush=True)
        del fns, weights
    kernels.tuning.set_prefetch_bytes(DEFAULT_SEVERAL)
    kernels.tuning.set_prefetch_one_block(DEFAULT_ONE_BLOCK)


if __name__ == "__main__":
    main()
