"""All of SmolLM2-135M's matmuls for one decode step, by three CPU paths, at 1-64 rows.

A pass (benchmarks/model_matmuls.py) is the 30 layers' qkv, o_proj, gate_up and down
matmuls plus the LM head, each on a fixed input of M rows, with every layer's own weights
(538 MB in fp32) streaming from memory; the figure is the best of several passes, in ms, and
for M=1 the weight bytes read per second.

Paths: ours (model/dense_linear.py's PackedLinear), ours-avx2 (the same, its AVX2 path forced
where the CPU would run the AVX-512 one; packed at the AVX-512 path's panel widths unless
--panel is given, 32 being the AVX2 path's own), ours-noamx (bf16 without the AMX path, where
the CPU has AMX), ours-dot and ours-fma (bf16 without AMX, by vdpbf16ps and by FMAs on
widened weights, whichever this CPU would pick), ours-1stream and ours-avx2-1stream (one row
reading one panel after another instead of several side by side), ours-1group and
ours-avx2-1group (many rows all in one row group instead of groups whose x fits a share of
L2), `x @ weight_t` (what
model/layers.py's Linear does), and oneDNN with its weights reordered once
(`torch.ops.mkldnn._reorder_linear_weight` + `torch.ops.mkldnn._linear_pointwise`).
benchmarks/roofline.py sets the same passes against this CPU's measured peaks.

    python3 benchmarks/studies/linear_microbench.py [--dtypes float32 bfloat16] [--rows 1 30]
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch

from benchmarks.model_matmuls import build, make_weights, pass_inputs, time_pass, weight_bytes
from model.dense_linear import load_dense_linear

ROWS = [1, 2, 4, 8, 16, 30, 64]
AMX_ROWS, AMX_CHUNK = 8, 0  # the kernel's defaults (model/kernels/csrc/dense_linear.cpp)
# Our paths' kernel settings: (AVX2 forced, AMX from rows, bf16 by FMAs: 1, 0, or -1 as chosen,
# one row's panels side by side, x bytes per row group: -1 as chosen, 0 all rows in one).
OUR_PATHS = {"ours": (False, AMX_ROWS, -1, True, -1), "ours-avx2": (True, AMX_ROWS, -1, True, -1),
             "ours-noamx": (False, 0, -1, True, -1), "ours-dot": (False, 0, 0, True, -1),
             "ours-fma": (False, 0, 1, True, -1), "ours-1stream": (False, AMX_ROWS, -1, False, -1),
             "ours-avx2-1stream": (True, AMX_ROWS, -1, False, -1),
             "ours-1group": (False, AMX_ROWS, -1, True, 0),
             "ours-avx2-1group": (True, AMX_ROWS, -1, True, 0)}
GROUP_BYTES = -1  # --group-bytes, for every path that does not set its own


def set_path(path: str) -> None:
    """The kernel's knobs for one of OUR_PATHS (the defaults for any other path)."""
    avx2, amx_rows, bf16_fma, streams, group_bytes = OUR_PATHS.get(path, OUR_PATHS["ours"])
    kernels = load_dense_linear()
    kernels.tuning.set_dense_group_bytes(GROUP_BYTES if group_bytes < 0 else group_bytes)
    kernels.tuning.set_dense_avx2(avx2)
    kernels.tuning.set_dense_amx(amx_rows, AMX_CHUNK)
    kernels.tuning.set_dense_bf16_fma(bf16_fma)
    kernels.tuning.set_dense_row_streams(streams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rows", nargs="+", type=int, default=ROWS)
    parser.add_argument("--paths", nargs="+", default=["ours", "matmul", "onednn"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--panel", type=int, default=None, help="ours: panel width (16..64)")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="ours: prefetch bytes, for rows in one row block and in several")
    parser.add_argument("--chunk", type=int, default=None, help="ours: k steps per chunk")
    parser.add_argument("--group-bytes", type=int, default=-1,
                        help="ours: x bytes per row group for many rows (0: one group; -1: as "
                             "chosen from this CPU's L2)")
    parser.add_argument("--no-lm-head", action="store_true",
                        help="leave the LM head out of each pass (prefill runs it on each "
                             "prompt's last token only)")
    args = parser.parse_args()
    global GROUP_BYTES
    GROUP_BYTES = args.group_bytes
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    load_dense_linear()
    if args.prefetch is not None:
        load_dense_linear().tuning.set_prefetch_bytes(args.prefetch)
        load_dense_linear().tuning.set_prefetch_one_block(args.prefetch)
    if args.chunk is not None:
        load_dense_linear().tuning.set_chunk_steps(args.chunk)
    kw = {} if args.panel is None else {"panel": args.panel}

    print(f"threads={args.threads}, best of {args.repeats} passes, ms per pass "
          f"(30 layers' qkv, o, gate_up, down{'' if args.no_lm_head else ' + LM head'})\n")
    print("| dtype | path | " + " | ".join(f"M={m}" for m in args.rows) + " | GB/s at M=1 |")
    print("|---|---|" + "---|" * (len(args.rows) + 1))
    for name in args.dtypes:
        dtype = getattr(torch, name)
        weights = make_weights(dtype)
        if args.no_lm_head:
            weights = weights[:-1]
        nbytes = weight_bytes(weights)
        for path in args.paths:
            try:
                fns = build("ours" if path.startswith("ours") else path, weights, **kw)
            except RuntimeError as exc:  # oneDNN's bf16 reorder needs AVX-512 (or AVX-NE-CONVERT)
                print(f"| {name} | {path} | not on this CPU: {str(exc).splitlines()[0]} |")
                continue
            cells, gbs = [], "-"
            set_path(path)
            for m in args.rows:
                t = time_pass(fns, pass_inputs(m, dtype), args.repeats)
                cells.append(f"{t * 1e3:.1f}")
                if m == 1:
                    gbs = f"{nbytes / t / 1e9:.1f}"
            set_path("ours")
            print(f"| {name} | {path} | " + " | ".join(cells) + f" | {gbs} |", flush=True)
            del fns
            gc.collect()
        del weights
        gc.collect()


if __name__ == "__main__":
    main()
