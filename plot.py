"""Draw PNG charts from bench.py result files: one line per label, one chart per metric.

Example:
    python3 plot.py results/nano-vllm.json results/vllm.json --out docs/charts
    python3 plot.py results/prefix-on.json results/prefix-off.json --prefix prefix_
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

matplotlib.use("Agg")  # no display needed; Figure objects are drawn off-screen

# (file name, JSON key, chart title, y-axis label)
CHARTS = [
    ("throughput.png", "throughput_tok_s", "Output throughput", "output tokens / s"),
    ("ttft.png", "ttft_p50_ms", "Time to first token (p50)", "TTFT p50 (ms)"),
    ("itl.png", "itl_p50_ms", "Inter-token latency (p50)", "ITL p50 (ms)"),
]


def load(paths: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for path in paths:
        run = json.loads(path.read_text())
        run.setdefault("label", path.stem)
        runs.append(run)
    return runs


def subtitle(runs: list[dict[str, Any]]) -> str:
    """Settings shared by all runs, e.g. 'max_tokens=100, system prompt ~500 tokens'."""
    parts = []
    max_tokens = {run.get("max_tokens") for run in runs}
    if len(max_tokens) == 1 and None not in max_tokens:
        parts.append(f"max_tokens={max_tokens.pop()}")
    repeats = {run.get("system_repeats") for run in runs}
    if len(repeats) == 1 and None not in repeats:
        n = repeats.pop()
        parts.append(f"system prompt ~{n * 10} tokens" if n else "no system prompt")
    return ", ".join(parts)


def plot_metric(runs: list[dict[str, Any]], key: str, title: str, ylabel: str,
                path: Path) -> None:
    fig = Figure(figsize=(8, 5), dpi=120)
    ax = fig.subplots()
    all_users: set[int] = set()
    top = 0.0
    for run in runs:
        points = sorted((lv["users"], lv[key]) for lv in run["levels"]
                        if lv.get(key) is not None)
        if not points:
            continue
        xs, ys = zip(*points)
        all_users.update(xs)
        top = max(top, *ys)
        ax.plot(xs, ys, marker="o", linewidth=2, label=run["label"])
    sub = subtitle(runs)
    ax.set_title(f"{title} vs concurrent users" + (f"\n{sub}" if sub else ""))
    ax.set_xlabel("concurrent users")
    ax.set_ylabel(ylabel)
    if all_users:
        ax.set_xticks(sorted(all_users))
    ax.set_ylim(0, top * 1.1 or 1.0)
    ax.grid(True, alpha=0.4)
    if ax.get_lines():
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", type=Path, nargs="+", help="JSON files written by bench.py")
    p.add_argument("--out", type=Path, default=Path("docs/charts"), help="output folder")
    p.add_argument("--prefix", default="", help="string prepended to each PNG file name")
    args = p.parse_args()
    runs = load(args.files)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, key, title, ylabel in CHARTS:
        path = args.out / f"{args.prefix}{name}"
        plot_metric(runs, key, title, ylabel, path)
        print(path)


if __name__ == "__main__":
    main()
