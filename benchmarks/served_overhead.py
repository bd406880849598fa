"""What serving adds to one user's inter-token latency: the engine alone and the server, in
turns, in one run.

    python3 benchmarks/served_overhead.py results/served-overhead \\
        "fp32=" "bf16=--dtype bfloat16" "q4_1=--weights q4_1" --turns 2

For each LABEL=SERVER_FLAGS and each turn, the engine alone (benchmarks/engine_loop.py
--as-served: the engine stepped in one process, no HTTP, no second process, with the thread
and prefetch choices the server's core takes) streams one greedy request of
--tokens tokens, then server.py with the same flags serves one user the same number of
tokens to benchmarks/bench.py. Saved: bench.py's LABEL-TURN.json, and overhead.json with
each turn's two ITL p50s and their difference.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.results import Machine, OverheadRow, ServedOverheadRun
from benchmarks.side_by_side import measure

ROOT = Path(__file__).resolve().parents[1]
# The flags engine_loop.py takes too.
ENGINE_FLAGS = ("--model", "--dtype", "--weights", "--activations", "--lm-head")


def engine_alone_itl(flags: list[str], tokens: int) -> float:
    """engine_loop.py's ITL p50 (ms) for one round with these server flags' precision."""
    kept = [f for i, f in enumerate(flags) if f in ENGINE_FLAGS or
            (i > 0 and flags[i - 1] in ENGINE_FLAGS)]
    out = subprocess.run([sys.executable, "benchmarks/engine_loop.py", *kept,
                          "--as-served", "--tokens", str(tokens),
                          "--rounds", "2"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    values = [float(v) for v in re.findall(r"ITL p50 ([0-9.]+) ms", out)]
    return values[-1]  # the second round: the first warms the engine up


def served_itl(path: Path) -> float:
    level = json.loads(path.read_text())["levels"][0]
    return level["itl_p50_ms"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("configs", nargs="+", metavar="LABEL=SERVER_FLAGS")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=100)
    args = parser.parse_args()
    rows = []
    for turn in range(1, args.turns + 1):
        for config in args.configs:
            label, _, text = config.partition("=")
            flags = shlex.split(text)
            alone = engine_alone_itl(flags, args.tokens)
            name = f"{label}-{turn}"
            if measure(name, ROOT / "server.py", flags, args.out,
                       ["--users", "1", "--max-tokens", str(args.tokens), "--rounds", "2"]):
                return 1
            served = served_itl(args.out / f"{name}.json")
            rows.append(OverheadRow(label, turn, text, alone, served, round(served - alone, 2)))
            print(f"{name}: engine alone {alone:.2f} ms, served {served:.2f} ms, "
                  f"overhead {served - alone:+.2f} ms", flush=True)
    ServedOverheadRun(Machine.this_one(), shlex.join(sys.argv), rows).save(
        args.out / "overhead.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
