"""Microbenchmark: the model's matmuls from Q4_1/Q8_0 codes against fp32 `x @ weight_t`.

All 30 layers' shapes (qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576) with the
default model's real weights, plus the LM head (576->49152), at 1 and 30 rows of x; both
paths in the same run. Usage: `heavy python3 -m model.bench_quantized [--repeats 30]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from model.gguf_weights import read_gguf
from model.prepare import fetch_default_gguf
from model.quantized import QuantizedLinear

LAYER_PARTS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


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


def measure(rows: int, fp32: list[torch.Tensor], quantized: list[QuantizedLinear],
            f_head: torch.Tensor, q_head: QuantizedLinear,
            repeats: int) -> dict[str, tuple[tuple[float, float], tuple[float, float]]]:
    """{part: (fp32 (best, median) ms, quantized (best, median) ms)}.

    "layers + head" is one decode step's matmuls: there the LM head's codes no longer sit in
    the last-level cache from the previous repeat, as they can when it runs alone."""
    xs = {k: torch.randn(rows, k) for k in (576, 1536)}

    def fp32_layers() -> None:
        for w in fp32:
            xs[w.shape[0]] @ w

    def quantized_layers() -> None:
        for q in quantized:
            q(xs[q.in_features])

    return {
        "layers": (timed_ms(fp32_layers, repeats), timed_ms(quantized_layers, repeats)),
        "lm head": (timed_ms(lambda: xs[576] @ f_head, repeats),
                    timed_ms(lambda: q_head(xs[576]), repeats)),
        "layers + head": (timed_ms(lambda: (fp32_layers(), xs[576] @ f_head), repeats),
                          timed_ms(lambda: (quantized_layers(), q_head(xs[576])), repeats)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 30])
    args = parser.parse_args()

    gguf = read_gguf(fetch_default_gguf())
    names = [f"layers.{i}.{p}" for i in range(gguf.num_layers) for p in LAYER_PARTS]
    layers = {n: gguf.quantized[n] for n in names}
    head = gguf.quantized["embed_tokens"]
    quantized = [QuantizedLinear(w) for w in layers.values()]
    fp32 = [w.dequantize().t().contiguous() for w in layers.values()]  # [in, out], as Linear
    q_head, f_head = QuantizedLinear(head), head.dequantize().t().contiguous()
    q_mb = sum(q.packed.numel() for q in quantized) / 1e6
    f_mb = sum(w.numel() * 4 for w in fp32) / 1e6
    print(f"threads: {torch.get_num_threads()}; layers: {len(names)} matmuls, "
          f"{q_mb:.1f} MB of Q4_1 vs {f_mb:.1f} MB fp32; LM head {q_head.packed.numel() / 1e6:.1f}"
          f" MB of Q8_0 vs {f_head.numel() * 4 / 1e6:.1f} MB fp32")
    print("ms, best / median of the repeats")
    print(f"{'rows':>4}  {'part':<14} {'fp32':>15} {'q4_1 + q8_0':>15} {'speed-up':>8}")
    with torch.inference_mode():
        for rows in args.rows:
            for part, (f_ms, q_ms) in measure(rows, fp32, quantized, f_head, q_head,
                                              args.repeats).items():
                print(f"{rows:>4}  {part:<14} {f_ms[0]:>7.2f} / {f_ms[1]:<5.2f} "
                      f"{q_ms[0]:>7.2f} / {q_ms[1]:<5.2f} {f_ms[0] / q_ms[0]:>7.1f}x")

if __name__ == "__main__":
    main()
