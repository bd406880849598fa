"""Markdown tables for the README from the JSON files that bench.py and profile_decode.py saved.

    python3 report.py results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(folder: Path, label: str) -> dict | None:
    path = folder / f"{label}.json"
    return json.loads(path.read_text()) if path.exists() else None


def by_users(run: dict) -> dict[int, dict]:
    return {level["users"]: level for level in run["levels"]}


def side_by_side(a: dict, b: dict) -> list[str]:
    """a against b at every user count both measured: throughput ratio and latencies."""
    la, lb = a["label"], b["label"]
    rows = [f"| users | {la} tok/s | {lb} tok/s | ratio | TTFT p50 (ms) | TTFT p99 (ms) "
            f"| ITL p50 (ms) | ITL p99 (ms) |", "|---|---|---|---|---|---|---|---|"]
    other = by_users(b)
    for users, x in sorted(by_users(a).items()):
        if users not in other:
            continue
        y = other[users]
        rows.append(
            f"| {users} | {x['throughput_tok_s']:.1f} | {y['throughput_tok_s']:.1f} "
            f"| {x['throughput_tok_s'] / y['throughput_tok_s']:.2f}x "
            f"| {x['ttft_p50_ms']:.0f} / {y['ttft_p50_ms']:.0f} "
            f"| {x['ttft_p99_ms']:.0f} / {y['ttft_p99_ms']:.0f} "
            f"| {x['itl_p50_ms']:.1f} / {y['itl_p50_ms']:.1f} "
            f"| {x['itl_p99_ms']:.1f} / {y['itl_p99_ms']:.1f} |")
    return rows


def profile_table(profile: dict) -> list[str]:
    results = profile["results"]
    heads = [f"{r['users']} x {r['context']}" for r in results]
    rows = ["| ms per decode step (users x context) | " + " | ".join(heads) + " |",
            "|---" * (len(results) + 1) + "|"]
    for part in results[0]["parts_ms"]:
        rows.append(f"| {part} | " + " | ".join(f"{r['parts_ms'][part]:.1f}"
                                               for r in results) + " |")
    for key, name in (("sum_of_parts_ms", "sum of parts"), ("model_runner_ms", "ModelRunner.run")):
        rows.append(f"| **{name}** | " + " | ".join(f"{r[key]:.1f}" for r in results) + " |")
    rows.append("| tokens/s (users / ModelRunner.run) | "
                + " | ".join(f"{r['tokens_per_s']:.0f}" for r in results) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, nargs="?", default=Path("results"))
    folder = parser.parse_args().folder
    pairs = [("nano-vllm", "baseline"), ("nano-vllm-bf16", "nano-vllm"),
             ("prefix-cache-on", "prefix-cache-off"), ("prefill-batched", "prefill-one-at-a-time")]
    for a, b in pairs:
        run_a, run_b = load(folder, a), load(folder, b)
        if run_a and run_b:
            print(f"\n{a} vs {b} (each cell: {a} / {b})\n")
            print("\n".join(side_by_side(run_a, run_b)))
    for name in ("profile_decode", "profile_decode_torch"):
        profile = load(folder, name)
        if profile:
            print(f"\n{name}: {profile['device']}, {profile['dtype']}, "
                  f"{profile['results'][0]['attention']} attention\n")
            print("\n".join(profile_table(profile)))


if __name__ == "__main__":
    main()
