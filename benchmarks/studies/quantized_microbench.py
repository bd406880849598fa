"""Microbenchmark: the model's matmuls from Q4_1/Q8_0 codes against fp32 `x @ weight_t`.

All 30 layers' shapes (qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576) with the
default model's real weights, plus the LM head (576->49152), at 1, 8, 30 and 64 rows of x:
fp32, q4_1 (the GGUF's codes; its LM head is Q8_0), q4_1-int8act (the same codes times int8
activations, `--activations int8`, its Q8_0 LM head too; AVX512-VNNI or AVX2) and
int8 (per output channel), in one run.
Usage: `python3 -m benchmarks.studies.quantized_microbench [--repeats 30] [--rows 1 30]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.model_matmuls import LAYER_PARTS
from model.gguf.llama_codes import read_gguf
from model.prepare import fetch_default_gguf
from model.weights.int8 import int8_per_channel
from model.weights.quantized import (
    QuantizedKernelUnavailable,
    QuantizedLinear,
    int8_activation_kernels,
)


def timed_ms(run: Callable[[], None], repeats: int) -> tuple[float, float]:
    """(best, median) wall time in ms. On a shared machine the best is the kernel's own
    speed; the median shows what the neighbours cost."""
    run()  # warm-up: caches, thread pool
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3, statistics.median(times) * 1e3


Matmul = Callable[[torch.Tensor], torch.Tensor]


class FP32Matmul:
    """Exactly what model/llama.py's Linear does."""

    def __init__(self, weight_t: torch.Tensor) -> None:
        self.weight_t = weight_t

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight_t


def megabytes(matmuls: list[Matmul]) -> float:
    return sum(m.packed.numel() if isinstance(m, QuantizedLinear) else 4 * m.weight_t.numel()
               for m in matmuls) / 1e6


def measure(rows: int, layers: list[Matmul], head: Matmul,
            repeats: int) -> dict[str, tuple[float, float]]:
    """{part: (best, median) ms} of one weights format.

    "layers + head" is one decode step's matmuls: there the LM head's weights no longer sit
    in the last-level cache from the previous repeat, as they can when it runs alone."""
    xs = {k: torch.randn(rows, k) for k in (576, 1536)}
    inputs = [xs[576] if i % 4 != 3 else xs[1536] for i in range(len(layers))]  # down: 1536

    def all_layers() -> None:
        for layer, x in zip(layers, inputs):
            layer(x)

    return {"layers": timed_ms(all_layers, repeats),
            "lm head": timed_ms(lambda: head(xs[576]), repeats),
            "layers + head": timed_ms(lambda: (all_layers(), head(xs[576])), repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 30, 64])
    args = parser.parse_args()

    gguf = read_gguf(fetch_default_gguf())
    names = [f"layers.{i}.{p}" for i in range(gguf.num_layers) for p in LAYER_PARTS]
    blocks = [gguf.quantized[n] for n in names] + [gguf.quantized["embed_tokens"]]
    dense = [w.dequantize() for w in blocks]  # [out, in]: the fp32 model's weights
    formats: dict[str, list[Matmul]] = {
        "fp32": [FP32Matmul(w.t().contiguous()) for w in dense],
        "q4_1": [QuantizedLinear(w) for w in blocks],  # Q4_1 layers, Q8_0 LM head
        "int8": [QuantizedLinear(int8_per_channel(w)) for w in dense],
    }
    try:
        int8_activation_kernels()
        formats["q4_1-int8act"] = [QuantizedLinear(w, "int8") for w in blocks]
    except QuantizedKernelUnavailable as exc:
        print(f"q4_1-int8act left out: {exc}")
    del dense
    for name, matmuls in formats.items():
        print(f"{name}: layers {megabytes(matmuls[:-1]):.1f} MB, "
              f"LM head {megabytes(matmuls[-1:]):.1f} MB")
    print(f"threads: {torch.get_num_threads()}; ms, best / median of {args.repeats} repeats")
    print(f"{'rows':>4}  {'part':<14}" + "".join(f"{name:>17}" for name in formats))
    with torch.inference_mode():
        for rows in args.rows:
            results = {name: measure(rows, m[:-1], m[-1], args.repeats)
                       for name, m in formats.items()}
            for part in results["fp32"]:
                cells = "".join(f"{r[part][0]:>9.2f} / {r[part][1]:<5.2f}"
                                for r in results.values())
                print(f"{rows:>4}  {part:<14}{cells}")


if __name__ == "__main__":
    main()
