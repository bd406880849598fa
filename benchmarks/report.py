"""Markdown tables for the README from the JSON files that bench.py and profile_decode.py saved.

    python3 benchmarks/report.py results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.results import BenchRun, ProfileRun, result_path

# The README's comparisons, by label (run_all.sh's labels): each cell is "first / second".
PAIRS = [("nano-vllm", "llama-cpp-f32"), ("nano-vllm-bf16", "llama-cpp-bf16"),
         ("nano-vllm-q4_1", "llama-cpp-q4_1"), ("nano-vllm-vs-baseline", "baseline"),
         ("nano-vllm", "baseline-with-our-kernels"),
         ("nano-vllm-bf16", "nano-vllm"), ("nano-vllm-q4_1", "nano-vllm"),
         ("nano-vllm", "nano-vllm-first-engine"),
         ("prefix-cache-on", "prefix-cache-off"), ("prefill-batched", "prefill-one-at-a-time")]
PROFILES = ["profile_decode", "profile_decode_bf16"]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?", default=Path("results"))
    folder = parser.parse_args().folder
    for a, b in PAIRS:
        path_a, path_b = result_path(folder, a), result_path(folder, b)
        if path_a.exists() and path_b.exists():
            print(f"\n{a} vs {b} (each cell: {a} / {b})\n")
            print("\n".join(side_by_side(BenchRun.load(path_a), BenchRun.load(path_b))))
    for name in PROFILES:
        path = result_path(folder, name)
        if path.exists():
            profile = ProfileRun.load(path)
            print(f"\n{name}: {profile.device}, {profile.dtype}, "
                  f"{profile.results[0].attention} attention\n")
            print("\n".join(profile_table(profile)))
            if any(cell.top_ops for cell in profile.results):
                print("\n" + "\n".join(top_ops_table(profile)))


if __name__ == "__main__":
    main()
