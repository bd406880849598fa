"""All of SmolLM2-135M's matmuls for one decode step, by three CPU paths, at 1-64 rows.

Every layer has its own weight tensors (538 MB in fp32), so the weights stream from memory
as in the real model instead of sitting in cache. A "pass" is the 30 layers' qkv, o_proj,
gate_up and down matmuls plus the LM head, each on a fixed input of M rows; the figure is
the best of several passes, in ms, and for M=1 the weight bytes read per second.

Paths: ours (model/dense_linear.py's PackedLinear), `x @ weight_t` (what model/layers.py's
Linear does), and oneDNN with its weights reordered once
(`torch.ops.mkldnn._reorder_linear_weight` + `torch.ops.mkldnn._linear_pointwise`).

    python3 benchmarks/studies/linear_microbench.py [--dtypes float32 bfloat16] [--rows 1 30]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from model.dense_linear import PackedLinear, load_dense_linear

HIDDEN, INTER, VOCAB, LAYERS = 576, 1536, 49152, 30
QKV = 576 + 2 * 192
SHAPES = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]  # (K, N)
ROWS = [1, 2, 4, 8, 16, 30, 64]


def all_shapes() -> list[tuple[int, int]]:
    return SHAPES * LAYERS + [(HIDDEN, VOCAB)]


def make_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    """Each matmul's weight as [K, N] contiguous (our Linear's weight_t)."""
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(k, n, generator=gen) * k**-0.5).to(dtype) for k, n in all_shapes()]


def build(path: str, weights: list[torch.Tensor], **kw) -> list[Callable]:
    if path == "ours":
        return [PackedLinear(w, **kw) for w in weights]
    if path == "matmul":
        return [w.__rmatmul__ for w in weights]
    if path == "onednn":
        fns = []
        for w in weights:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous())
            fns.append(lambda x, p=packed: torch.ops.mkldnn._linear_pointwise(
                x, p, None, "none", [], ""))
        return fns
    raise ValueError(path)


def time_pass(fns: list[Callable], inputs: dict[int, torch.Tensor], ks: list[int],
              repeats: int) -> float:
    """Best wall time of one pass over every matmul, in seconds."""
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        for fn, k in zip(fns, ks):
            fn(inputs[k])
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rows", nargs="+", type=int, default=ROWS)
    parser.add_argument("--paths", nargs="+", default=["ours", "matmul", "onednn"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--panel", type=int, default=None, help="ours: panel width (16..64)")
    parser.add_argument("--prefetch", type=int, default=None, help="ours: prefetch bytes")
    parser.add_argument("--chunk", type=int, default=None, help="ours: k steps per chunk")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    load_dense_linear()
    if args.prefetch is not None:
        load_dense_linear().set_prefetch_bytes(args.prefetch)
    if args.chunk is not None:
        load_dense_linear().set_chunk_steps(args.chunk)
    kw = {} if args.panel is None else {"panel": args.panel}

    ks = [k for k, _ in all_shapes()]
    print(f"threads={args.threads}, best of {args.repeats} passes, ms per pass "
          "(30 layers' qkv, o, gate_up, down + LM head)\n")
    print("| dtype | path | " + " | ".join(f"M={m}" for m in args.rows) + " | GB/s at M=1 |")
    print("|---|---|" + "---|" * (len(args.rows) + 1))
    for name in args.dtypes:
        dtype = getattr(torch, name)
        weights = make_weights(dtype)
        nbytes = sum(w.numel() * w.element_size() for w in weights)
        for path in args.paths:
            fns = build(path, weights, **kw)
            cells, gbs = [], "-"
            for m in args.rows:
                gen = torch.Generator().manual_seed(m)
                inputs = {k: torch.randn(m, k, generator=gen).to(dtype) for k in set(ks)}
                t = time_pass(fns, inputs, ks, args.repeats)
                cells.append(f"{t * 1e3:.1f}")
                if m == 1:
                    gbs = f"{nbytes / t / 1e9:.1f}"
            print(f"| {name} | {path} | " + " | ".join(cells) + f" | {gbs} |", flush=True)
            del fns
            gc.collect()
        del weights
        gc.collect()


if __name__ == "__main__":
    main()
