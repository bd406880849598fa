"""benchmarks/roofline.py's arithmetic and its results-page section, on tiny shapes (nothing
timed, no model)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.results import ComputePeak, Machine, RooflineRun, result_path
from benchmarks.results_page import roofline_sections
from benchmarks.roofline import (
    activation_bytes,
    bound,
    pass_flop,
    ridge_point,
    roofline_cell,
    theoretical_peak,
)

SHAPES = [(8, 24), (24, 8), (8, 40)]  # (K, N), as benchmarks/model_matmuls.all_shapes()


@pytest.mark.parametrize("rows", [1, 3])
def test_flop_and_bytes_match_real_matmuls(rows: int) -> None:
    """pass_flop against torch's own FLOP counter, activation_bytes against the tensors that
    a pass of real matmuls reads and writes."""
    xs = [torch.randn(rows, k) for k, _ in SHAPES]
    ws = [torch.randn(k, n) for k, n in SHAPES]
    with FlopCounterMode(display=False) as counter:
        ys = [x @ w for x, w in zip(xs, ws)]
    moved = sum(x.nbytes + y.nbytes for x, y in zip(xs, ys))
    print(f"rows={rows}: {pass_flop(SHAPES, rows)} FLOP vs counted "
          f"{counter.get_total_flops()}; {activation_bytes(SHAPES, rows, 4)} B vs {moved}")
    assert pass_flop(SHAPES, rows) == counter.get_total_flops()
    assert activation_bytes(SHAPES, rows, 4) == moved
    assert activation_bytes(SHAPES, rows, 2) * 2 == moved  # bf16 moves half the bytes


def test_cell_figures_and_bound() -> None:
    """100 GB/s and 1000 GFLOP/s: the ridge is at 10 FLOP/B; below it the bandwidth roof
    applies, above it the compute roof."""
    peak_gbs, peak_gflops = 100.0, 1000.0
    assert ridge_point(peak_gflops, peak_gbs) == 10.0
    low = roofline_cell("p", "float32", 1, 0.01, flop=10**8, weights=9 * 10**7,
                        activations=10**7, peak_gbs=peak_gbs, peak_gflops=peak_gflops)
    print(low)
    assert low.ms == pytest.approx(10.0) and low.gflops == pytest.approx(10.0)
    assert low.gbs == pytest.approx(10.0) and low.intensity == pytest.approx(1.0)
    assert low.weight_mb == pytest.approx(90.0) and low.activation_mb == pytest.approx(10.0)
    assert low.bound == "memory"
    assert low.of_bandwidth == pytest.approx(0.1) and low.of_compute == pytest.approx(0.01)
    assert low.of_roofline == pytest.approx(low.of_bandwidth)  # roof: 1 FLOP/B x 100 GB/s
    high = roofline_cell("p", "float32", 64, 0.01, flop=5 * 10**9, weights=10**8,
                         activations=0, peak_gbs=peak_gbs, peak_gflops=peak_gflops)
    print(high)
    assert high.intensity == pytest.approx(50.0) and high.bound == "compute"
    assert high.of_compute == pytest.approx(0.5) and high.of_roofline == pytest.approx(0.5)
    assert bound(9.99, 10.0) == "memory" and bound(10.0, 10.0) == "compute"


def test_theoretical_peak_needs_the_flags_and_a_maximum_clock() -> None:
    avx512 = frozenset({"avx512f", "avx2", "fma"})
    fp32, note = theoretical_peak("float32", 2, avx512, (2000.0, "test"))
    print(fp32, note)
    assert fp32 == pytest.approx(2 * 2.0 * 32)  # 16 fp32 lanes x (multiply + add)
    bf16, _ = theoretical_peak("bfloat16", 2, avx512 | {"avx512_bf16"}, (2000.0, "test"))
    assert bf16 == pytest.approx(2 * fp32)
    avx2, _ = theoretical_peak("float32", 1, frozenset({"avx2", "fma"}), (1000.0, "test"))
    assert avx2 == pytest.approx(16.0)
    # without AVX512_BF16, bf16 is widened and runs the AVX2 path's 8-lane FMAs
    widened, _ = theoretical_peak("bfloat16", 2, avx512, (2000.0, "test"))
    assert widened == pytest.approx(fp32 / 2)
    for dtype, flags, clock in [("float32", avx512, (None, "")),
                                ("bfloat16", frozenset({"sse2"}), (2000.0, "test"))]:
        value, note = theoretical_peak(dtype, 2, flags, clock)
        print(dtype, note)
        assert value is None and note.startswith("not read")


def roofline_run(cpu: str, started_at: str, ms: float) -> RooflineRun:
    machine = Machine("Linux", "3.12", "x86_64", 2, cpu)
    peaks = [ComputePeak(d, 64, {"ours": g, "torch": g / 2}, g, None, "not read (test)")
             for d, g in (("float32", 200.0), ("bfloat16", 400.0))]
    cells = [roofline_cell(path, dtype, m, ms / 1e3, pass_flop(SHAPES, m), 10**6,
                           activation_bytes(SHAPES, m, 4), 40.0, 200.0 * (1 + (dtype != "float32")))
             for path, dtype in (("ours-fp32", "float32"), ("ours-bf16", "bfloat16"))
             for m in (1, 64)]
    return RooflineRun("x", machine, started_at, "python3 benchmarks/roofline.py", 2, 3, 40.0,
                       60.0, 400.0, peaks, cells)


def test_results_page_has_one_roofline_table_per_cpu(tmp_path: Path) -> None:
    assert roofline_sections(tmp_path) == []  # no folder: no section
    (tmp_path / "roofline").mkdir()
    assert roofline_sections(tmp_path) == []  # an empty folder: none either
    runs = {"a-old": roofline_run("CPU A", "2026-01-01T00:00:00+00:00", ms=9.0),
            "a-new": roofline_run("CPU A", "2026-02-01T00:00:00+00:00", ms=2.0),
            "b": roofline_run("CPU B", "2026-01-15T00:00:00+00:00", ms=5.0)}
    for label, run in runs.items():
        replace(run, label=label).save(result_path(tmp_path / "roofline", label))
    loaded = RooflineRun.load(result_path(tmp_path / "roofline", "b"))
    assert loaded.to_json() == replace(runs["b"], label="b").to_json()
    [section] = roofline_sections(tmp_path)
    text = "\n".join(section.render(tmp_path))
    print(text)
    assert "CPU: CPU A and CPU B, 2 cores." in text
    assert "`results/roofline/a-new.json`" in text and "a-old.json" not in text
    heads = [line for line in text.splitlines() if line.startswith("| path |")]
    assert len(heads) == 2  # one cell table per CPU
    for run in (runs["a-new"], runs["b"]):
        for cell in run.cells:
            row = (f"| {cell.path} | {cell.rows} | {cell.ms:.2f} | {cell.gflops:.1f} | "
                   f"{cell.gbs:.1f} | {cell.intensity:.2f} | {cell.bound} |")
            assert row in text, row


def test_instruction_peak_column_and_runs_from_before_it(tmp_path: Path) -> None:
    """A run with fp32's measured FMA peak shows each fp32 pass's fraction of it, and a
    dash for bf16 (no one instruction there); a run saved before the field loads without
    one."""
    run = roofline_run("CPU A", "2026-02-01T00:00:00+00:00", ms=2.0)
    run.compute[0] = replace(run.compute[0], instruction_gflops=400.0)
    path = result_path(tmp_path / "roofline", "a")
    run.save(path)
    [section] = roofline_sections(tmp_path)
    text = "\n".join(section.render(tmp_path))
    print(text)
    assert "instruction peak 400 GFLOP/s" in text
    assert "instruction peak not measured" in text  # bf16's peak row
    for cell in run.cells:
        share = f"{cell.gflops / 400.0:.0%}" if cell.dtype == "float32" else "-"
        [line] = [x for x in text.splitlines() if x.startswith(f"| {cell.path} | {cell.rows} |")]
        assert line.endswith(f"| {share} |"), line

    data = json.loads(path.read_text())
    for peak in data["compute"]:
        del peak["instruction_gflops"]
    path.write_text(json.dumps(data))
    assert [c.instruction_gflops for c in RooflineRun.load(path).compute] == [None, None]
