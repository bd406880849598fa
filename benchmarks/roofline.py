"""How far each matmul path is from this CPU's measured peaks: a roofline of a decode step.

First the peaks, on the engine's thread count: memory bandwidth (a streaming sum and a copy
over a few hundred MB, best of N) and compute per dtype (a large square GEMM through our
kernel and through torch/oneDNN; the best is the achievable peak). Beside it, for fp32, the
instruction peak: every thread running independent FMA chains on registers only (the
kernels module's dense_fma_peak); bf16 runs on three instructions by row count and CPU
(vdpbf16ps, FMAs on widened weights, AMX), so it has none. And the theoretical peak where
the CPU's flags and maximum clock can be read, else "not read".

Then each path makes passes over the default model's matmuls (benchmarks/model_matmuls.py:
30 layers' qkv, o_proj, gate_up, down + LM head) at each row count: ms per pass, GFLOP/s
(2*M*N*K / t), GB/s ((weight + activation bytes) / t), their fractions of the peaks, and the
bound: arithmetic intensity (FLOP per byte) below the ridge point (compute peak / bandwidth)
is memory bound, above it compute bound. q4_1 dequantizes to fp32 and multiplies by FMA, so
it is held against the fp32 compute peak.

    python3 benchmarks/roofline.py [--label NAME] [--rows 1 8 30 64] [--repeats 7]

Saves results/roofline/<label>.json (default label: the CPU's name) and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import torch

from benchmarks.model_matmuls import (
    all_shapes,
    build,
    make_weights,
    pass_inputs,
    q4_1_matmuls,
    time_pass,
    weight_bytes,
)
from benchmarks.results import ComputePeak, Machine, RooflineCell, RooflineRun, result_path
from model.dense_linear import PackedLinear, load_dense_linear
from model.kernels.cpu import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
ROWS = [1, 8, 30, 64]
# name: (weights, the compute peak it is held against, model_matmuls.build's path)
PATHS = {"ours-fp32": ("float32", "float32", "ours"),
         "ours-bf16": ("bfloat16", "bfloat16", "ours"),
         "ours-q4_1": ("q4_1", "float32", "q4_1"),
         "torch-fp32": ("float32", "float32", "matmul"),
         "torch-bf16": ("bfloat16", "bfloat16", "matmul")}
Shapes = list[tuple[int, int]]


def pass_flop(shapes: Shapes, rows: int) -> int:
    """2 * M * N * K summed over every (K, N) matmul of a pass."""
    return sum(2 * rows * n * k for k, n in shapes)


def activation_bytes(shapes: Shapes, rows: int, element_size: int) -> int:
    """Each matmul reads its input [M, K] and writes its output [M, N]."""
    return sum(rows * (k + n) * element_size for k, n in shapes)


def ridge_point(peak_gflops: float, peak_gbs: float) -> float:
    """The intensity (FLOP per byte) where the bandwidth roof meets the compute roof."""
    return peak_gflops / peak_gbs


def bound(intensity: float, ridge: float) -> str:
    return "memory" if intensity < ridge else "compute"


def roofline_cell(path: str, dtype: str, rows: int, seconds: float, flop: int, weights: int,
                  activations: int, peak_gbs: float, peak_gflops: float) -> RooflineCell:
    """One pass's figures against the peaks (bytes and FLOP of the whole pass)."""
    moved = weights + activations
    gflops, gbs = flop / seconds / 1e9, moved / seconds / 1e9
    intensity = flop / moved
    attainable = min(peak_gflops, intensity * peak_gbs)
    return RooflineCell(path, dtype, rows, seconds * 1e3, flop / 1e9, weights / 1e6,
                        activations / 1e6, gflops, gbs, intensity,
                        bound(intensity, ridge_point(peak_gflops, peak_gbs)),
                        gbs / peak_gbs, gflops / peak_gflops, gflops / attainable)


def flop_per_cycle(dtype: str, flags: frozenset[str]) -> int | None:
    """FLOP one FMA unit does per cycle: fp32 FMA lanes x 2, bf16 dot products (VDPBF16PS:
    two products and their sum per fp32 lane) x 4; without AVX512_BF16, bf16 runs as fp32
    FMAs after widening (the kernel's AVX2 path, 8 lanes); None without FMA."""
    avx2 = 8 if {"avx2", "fma"} <= flags else 0
    if dtype == "bfloat16":
        return 4 * 16 if "avx512_bf16" in flags else 2 * avx2 or None
    return 2 * (16 if "avx512f" in flags else avx2) or None


def max_clock_mhz() -> tuple[float | None, str]:
    """The maximum clock and where it came from; None where the system does not say (a
    VM's /proc/cpuinfo 'cpu MHz' is the current or nominal clock, not the maximum)."""
    sysfs = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(sysfs.read_text()) / 1e3, "cpufreq's cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    found = re.search(r"^CPU max MHz:\s*([\d.]+)", out, re.MULTILINE)
    return (float(found[1]), "lscpu's CPU max MHz") if found else (None, "")


def theoretical_peak(dtype: str, threads: int, flags: frozenset[str],
                     clock: tuple[float | None, str]) -> tuple[float | None, str]:
    """threads x maximum clock x FLOP per cycle of one FMA unit, and how it was read. The
    flags do not say how many FMA units a core has (1 or 2), so the figure is per unit."""
    per_cycle = flop_per_cycle(dtype, flags)
    mhz, source = clock
    if per_cycle is None:
        return None, f"not read (no {dtype} vector FMA in the CPU's flags)"
    if mhz is None:
        return None, "not read (no maximum clock here: no cpufreq, no 'CPU max MHz' in lscpu)"
    return (threads * mhz / 1e3 * per_cycle,
            f"{threads} threads x {mhz:.0f} MHz ({source}) x {per_cycle} FLOP/cycle per FMA "
            "unit; times the FMA units per core (1 or 2), which the flags do not say")


def best_time(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def stream_bandwidth(megabytes: float, repeats: int) -> tuple[float, float]:
    """(read, copy) GB/s: a sum over the buffer, and a copy of it (bytes read + written)."""
    x = torch.ones(int(megabytes * 1e6) // 4)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    read = nbytes / best_time(x.sum, repeats) / 1e9
    copy = 2 * nbytes / best_time(lambda: y.copy_(x), repeats) / 1e9
    return read, copy


def compute_peak(dtype: str, size: int, repeats: int, threads: int) -> ComputePeak:
    """A size^3 GEMM through our kernel and torch's `x @ W`; the best is the peak."""
    gen = torch.Generator().manual_seed(1)
    x, w = (torch.randn(size, size, generator=gen).to(getattr(torch, dtype)) for _ in "xw")
    fns = {"ours": PackedLinear(w), "torch": w.__rmatmul__}
    flop = 2 * size**3
    by_path = {name: flop / best_time(lambda f=fn: f(x), repeats) / 1e9
               for name, fn in fns.items()}
    theory, note = theoretical_peak(dtype, threads, cpu_flags(), max_clock_mhz())
    kernels = load_dense_linear() if dtype == "float32" else None
    instruction = kernels.tuning.dense_fma_peak(threads) if kernels else None
    return ComputePeak(dtype, size, by_path, max(by_path.values()), theory, note,
                       instruction or None)


def measure_path(path: str, rows: list[int], repeats: int, peak_gbs: float,
                 peaks: dict[str, ComputePeak]) -> list[RooflineCell]:
    weights_dtype, dtype, kind = PATHS[path]
    if kind == "q4_1":
        fns, nbytes = q4_1_matmuls()
        act_dtype = torch.float32
    else:
        act_dtype = getattr(torch, weights_dtype)
        weights = make_weights(act_dtype)
        fns = build(kind, weights)
        # what the path reads: ours its packed copy (the weight itself where it fell back)
        nbytes = weight_bytes([f.weight_t if f.packed is None else f.packed for f in fns]
                              if kind == "ours" else weights)
        del weights  # ours keeps only its packed copy
    shapes, size = all_shapes(), act_dtype.itemsize
    cells = [roofline_cell(path, dtype, m, time_pass(fns, pass_inputs(m, act_dtype), repeats),
                           pass_flop(shapes, m), nbytes, activation_bytes(shapes, m, size),
                           peak_gbs, peaks[dtype].best_gflops) for m in rows]
    del fns
    gc.collect()
    return cells


def default_label(cpu: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") or "this-cpu"


def print_run(run: RooflineRun) -> None:
    print(f"{run.machine.cpu}, {run.threads} threads: read {run.read_gbs:.1f} GB/s, copy "
          f"{run.copy_gbs:.1f} GB/s over {run.stream_mb:.0f} MB")
    for c in run.compute:
        paths = ", ".join(f"{name} {g:.0f}" for name, g in c.gflops_by_path.items())
        print(f"{c.dtype}: {c.best_gflops:.0f} GFLOP/s ({paths}; {c.gemm_size}^3 GEMM), ridge "
              f"{ridge_point(c.best_gflops, run.read_gbs):.1f} FLOP/B; {c.instruction_text()}; "
              "theoretical: "
              + (f"{c.theoretical_gflops:.0f} GFLOP/s ({c.theoretical_note})"
                 if c.theoretical_gflops is not None else c.theoretical_note))
    print("\n| path | M | ms | GFLOP/s | GB/s | FLOP/B | bound | % BW | % compute | % roof |")
    print("|---" * 10 + "|")
    for x in run.cells:
        print(f"| {x.path} | {x.rows} | {x.ms:.2f} | {x.gflops:.1f} | {x.gbs:.1f} | "
              f"{x.intensity:.2f} | {x.bound} | {x.of_bandwidth:.0%} | {x.of_compute:.0%} | "
              f"{x.of_roofline:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default=None, help="file name (default: the CPU's name)")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results" / "roofline")
    parser.add_argument("--rows", nargs="+", type=int, default=ROWS)
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="the engine's default: 2")
    parser.add_argument("--stream-mb", type=float, default=400.0)
    parser.add_argument("--gemm-size", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    machine = Machine.this_one()
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    read, copy = stream_bandwidth(args.stream_mb, args.repeats)
    peaks = {d: compute_peak(d, args.gemm_size, args.repeats, args.threads)
             for d in ("float32", "bfloat16")}
    cells = [cell for path in args.paths
             for cell in measure_path(path, args.rows, args.repeats, read, peaks)]
    run = RooflineRun(args.label or default_label(machine.cpu), machine, started_at,
                      "python3 " + shlex.join(sys.argv), args.threads, args.repeats, read, copy,
                      args.stream_mb, list(peaks.values()), cells)
    print_run(run)
    path = result_path(args.results_dir, run.label)
    run.save(path)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
