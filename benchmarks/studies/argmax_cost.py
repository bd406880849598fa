"""What greedy sampling's argmax costs a decode step, by path: the compiled kernel the sampler
uses (model/kernels/csrc/argmax_cpu.cpp: rows split over the threads, bf16 read as it is) and the
NumPy path it keeps for one fp32 row and other dtypes (a widened fp32 copy, then NumPy's
argmax on one thread).

    python3 benchmarks/studies/argmax_cost.py --rows 1 30

Random logits of the default model's vocabulary, on torch's threads (the engine's); each
path's best of 5 runs of 300 calls, each call's list of tokens included.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from benchmarks.results import cpu_model
from benchmarks.roofline import best_time
from model.kernels.build import load_cpu_kernels

VOCAB = 49152  # SmolLM2's


def best_ms(fn: Callable[[], list[int]], calls: int = 300, runs: int = 5) -> float:
    """ms per call: the best of `runs` runs of `calls` calls."""
    return best_time(lambda: [fn() for _ in range(calls)], runs) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 30])
    args = parser.parse_args()
    kernels = load_cpu_kernels()
    if kernels is None:
        sys.exit("the CPU kernels could not be built here")
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, vocabulary {VOCAB}")
    print("| dtype | rows | NumPy (ms) | kernel (ms) |\n|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for rows in args.rows:
            logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows))
            logits = logits.to(dtype)
            paths = {"numpy": lambda x=logits: x.float().numpy().argmax(axis=-1).tolist(),
                     "kernel": lambda x=logits: kernels.argmax_rows(x).tolist()}
            assert paths["numpy"]() == paths["kernel"]()
            numpy_ms, kernel_ms = best_ms(paths["numpy"]), best_ms(paths["kernel"])
            print(f"| {str(dtype).removeprefix('torch.')} | {rows} | {numpy_ms:.3f} | "
                  f"{kernel_ms:.3f} |")


if __name__ == "__main__":
    main()
