"""Draw PNG charts from bench.py result files: one line per label, one chart per metric.

Example:
    python3 benchmarks/plot.py results/nano-vllm.json results/baseline.json --out docs/charts
    python3 benchmarks/plot.py results/prefix-cache-on.json results/prefix-cache-off.json \
        --prefix prefix_
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import matplotlib
from matplotlib.figure import Figure

from benchmarks.results import BenchRun, LevelResult

matplotlib.use("Agg")  # no display needed; Figure objects are drawn off-screen


@dataclass
class Chart:
    file_name: str
    title: str
    ylabel: str
    metric: Callable[[LevelResult], float | None]


CHARTS = [
    Chart("throughput.png", "Output throughput", "output tokens / s",
          lambda level: level.throughput_tok_s),
    Chart("ttft.png", "Time to first token (p50)", "TTFT p50 (ms)",
          lambda level: level.ttft_p50_ms),
    Chart("itl.png", "Inter-token latency (p50)", "ITL p50 (ms)", lambda level: level.itl_p50_ms),
]


def subtitle(runs: list[BenchRun]) -> str:
    """Settings shared by all runs, e.g. 'max_tokens=100, system prompt ~500 tokens'."""
    parts = []
    max_tokens = {run.max_tokens for run in runs}
    if len(max_tokens) == 1:
        parts.append(f"max_tokens={max_tokens.pop()}")
    repeats = {run.system_repeats for run in runs}
    if len(repeats) == 1:
        n = repeats.pop()
        parts.append(f"system prompt ~{n * 10} tokens" if n else "no system prompt")
    cpus = {run.machine.cpu for run in runs}
    if len(cpus) == 1:
        parts.append(cpus.pop())
    return ", ".join(parts)


def plot_metric(runs: list[BenchRun], chart: Chart, path: Path) -> None:
    fig = Figure(figsize=(8, 5), dpi=120)
    ax = fig.subplots()
    all_users: set[int] = set()
    top = 0.0
    for run in runs:
        points = sorted((level.users, value) for level in run.levels
                        if (value := chart.metric(level)) is not None)
        if not points:
            continue
        xs, ys = zip(*points)
        all_users.update(xs)
        top = max(top, *ys)
        ax.plot(xs, ys, marker="o", linewidth=2, label=run.label)
    sub = subtitle(runs)
    ax.set_title(f"{chart.title} vs concurrent users" + (f"\n{sub}" if sub else ""))
    ax.set_xlabel("concurrent users")
    ax.set_ylabel(chart.ylabel)
    if all_users:
        ax.set_xticks(sorted(all_users))
    ax.set_ylim(0, top * 1.1 or 1.0)
    ax.grid(True, alpha=0.4)
    if ax.get_lines():
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def draw_charts(runs: list[BenchRun], out: Path, prefix: str = "") -> list[Path]:
    """One PNG per chart in CHARTS, named {prefix}{file name}, in folder `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for chart in CHARTS:
        path = out / f"{prefix}{chart.file_name}"
        plot_metric(runs, chart, path)
        paths.append(path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", type=Path, nargs="+", help="JSON files written by bench.py")
    p.add_argument("--out", type=Path, default=Path("docs/charts"), help="output folder")
    p.add_argument("--prefix", default="", help="string prepended to each PNG file name")
    args = p.parse_args()
    for path in draw_charts([BenchRun.load(path) for path in args.files], args.out,
                            args.prefix):
        print(path)


if __name__ == "__main__":
    main()
