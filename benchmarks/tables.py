"""Markdown tables from the result files that bench.py, profile_decode.py and roofline.py save."""

from __future__ import annotations

from benchmarks.results import BenchRun, ProfileRun, RooflineCell, RooflineRun


def side_by_side(a: BenchRun, b: BenchRun) -> list[str]:
    """a against b at every user count both measured: throughput ratio and latencies."""
    rows = [f"| users | {a.label} tok/s | {b.label} tok/s | ratio | TTFT p50 (ms) | TTFT p99 (ms) "
            f"| ITL p50 (ms) | ITL p99 (ms) |", "|---|---|---|---|---|---|---|---|"]
    other = b.by_users()
    for users, x in sorted(a.by_users().items()):
        if users not in other:
            continue
        y = other[users]
        assert x.throughput_tok_s is not None and y.throughput_tok_s is not None
        rows.append(
            f"| {users} | {x.throughput_tok_s:.1f} | {y.throughput_tok_s:.1f} "
            f"| {x.throughput_tok_s / y.throughput_tok_s:.2f}x "
            f"| {x.ttft_p50_ms:.0f} / {y.ttft_p50_ms:.0f} "
            f"| {x.ttft_p99_ms:.0f} / {y.ttft_p99_ms:.0f} "
            f"| {x.itl_p50_ms:.1f} / {y.itl_p50_ms:.1f} "
            f"| {x.itl_p99_ms:.1f} / {y.itl_p99_ms:.1f} |")
    return rows


def markdown_table(corner: str, heads: list[str], rows: list[tuple[str, list[str]]]) -> list[str]:
    lines = [f"| {corner} | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    return lines + [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]


def profile_table(profile: ProfileRun) -> list[str]:
    """Rows: the parts of a decode step, their sum, the unprofiled step; columns: the cells."""
    cells = profile.results
    heads = [f"{c.users} x {c.context}" for c in cells]
    rows = [(part, [f"{c.parts_ms.get(part, 0.0):.1f}" for c in cells])
            for part in cells[0].parts_ms]
    rows.append(("**sum of parts**", [f"{c.sum_of_parts_ms:.1f}" for c in cells]))
    rows.append(("**decode step**", [f"{c.step_ms:.1f}" for c in cells]))
    rows.append(("tokens/s (users / decode step)", [f"{c.tokens_per_s:.0f}" for c in cells]))
    return markdown_table("ms per decode step (users x context)", heads, rows)


def top_ops_table(profile: ProfileRun) -> list[str]:
    """Self time of the ops that were among the most expensive in any cell; '-' where an op
    was not among that cell's top ops."""
    cells = profile.results
    names: dict[str, float] = {}
    for cell in cells:
        for op in cell.top_ops:
            names[op.name] = max(names.get(op.name, 0.0), op.self_ms)
    by_cell = [{op.name: op for op in cell.top_ops} for cell in cells]
    rows = [(f"`{name}`", [f"{ops[name].self_ms:.1f}" if name in ops else "-" for ops in by_cell])
            for name in sorted(names, key=names.__getitem__, reverse=True)]
    heads = [f"{c.users} x {c.context}" for c in cells]
    return markdown_table("op self time, ms per step (users x context)", heads, rows)


def roofline_tables(run: RooflineRun) -> list[str]:
    """The peaks (and how each was measured), then every path's passes against them."""
    peaks = [("memory bandwidth, read", [f"{run.read_gbs:.1f} GB/s",
                                         f"a sum over {run.stream_mb:.0f} MB"]),
             ("memory bandwidth, copy", [f"{run.copy_gbs:.1f} GB/s",
                                         "a copy, bytes read + written"])]
    for c in run.compute:
        paths = ", ".join(f"{name} {g:.0f}" for name, g in c.gflops_by_path.items())
        theory = (f"{c.theoretical_gflops:.0f} GFLOP/s per FMA unit ({c.theoretical_note})"
                  if c.theoretical_gflops is not None else c.theoretical_note)
        peaks.append((f"{c.dtype} compute", [
            f"{c.best_gflops:.0f} GFLOP/s",
            f"the best of {paths} on a {c.gemm_size}³ GEMM; ridge point "
            f"{c.best_gflops / run.read_gbs:.1f} FLOP/byte; {c.instruction_text()}; "
            f"theoretical: {theory}"]))

    def of_instruction(cell: RooflineCell) -> str:
        peak = run.peak(cell.dtype).instruction_gflops
        return f"{cell.gflops / peak:.0%}" if peak else "-"

    cells = [(x.path, [f"{x.rows}", f"{x.ms:.2f}", f"{x.gflops:.1f}", f"{x.gbs:.1f}",
                       f"{x.intensity:.2f}", x.bound, f"{x.of_bandwidth:.0%}",
                       f"{x.of_compute:.0%}", f"{x.of_roofline:.0%}", of_instruction(x)])
             for x in run.cells]
    return [*markdown_table("peak", ["measured", "how"], peaks), "",
            *markdown_table("path", ["rows", "ms per pass", "GFLOP/s", "GB/s", "FLOP/byte",
                                     "bound", "% of read bandwidth", "% of compute peak",
                                     "% of roofline", "% of instruction peak"], cells)]
