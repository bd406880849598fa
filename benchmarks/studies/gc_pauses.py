"""The garbage collector's pauses in a served run: every collection in the HTTP process and
the engine core process, by generation, while a load runs.

    python3 benchmarks/studies/gc_pauses.py                    # this tree
    python3 benchmarks/studies/gc_pauses.py --cwd DIR --loads 4 -- --dtype bfloat16

Starts server.py (from --cwd, with the flags after `--`) with a `sitecustomize` module on its
PYTHONPATH that times each collection in every Python process of the server and appends it to
a file, warms it with one round of the load, then runs `benchmarks/bench.py --users 30
--max-tokens 100 --rounds 2` --loads times and prints, per process, the collections that
ended during those loads: how many of each generation, their total and their longest. A
full (generation 2) collection stops its process for as long as it walks every tracked
object: the event loop that streams every answer, or the engine between two steps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

from benchmarks.live_server import LiveServer
from benchmarks.results import cpu_model

ROOT = Path(__file__).resolve().parents[2]

# Imported at start-up by every Python process whose path has its folder: one line per
# finished collection, "pid wall-clock-end generation seconds", to the file in GC_PAUSES_LOG.
HOOK = """
import gc, os, time
_log = open(os.environ["GC_PAUSES_LOG"], "a", buffering=1)
_began = [0.0]

def _timed(phase, info):
    if phase == "start":
        _began[0] = time.perf_counter()
    else:
        took = time.perf_counter() - _began[0]
        _log.write(f"{os.getpid()} {time.time():.6f} {info['generation']} {took:.6f}\\n")

gc.callbacks.append(_timed)
"""


def bench(url: str, rounds: int) -> None:
    subprocess.run([sys.executable, "benchmarks/bench.py", "--url", url, "--users", "30",
                    "--max-tokens", "100", "--rounds", str(rounds), "--results-dir",
                    tempfile.gettempdir(), "--label", "gc-pauses"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cwd", default=str(ROOT), help="the tree whose server.py runs")
    parser.add_argument("--loads", type=int, default=4, help="runs of the 30-user load")
    parser.add_argument("server_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    flags = [f for f in args.server_flags if f != "--"]
    with tempfile.TemporaryDirectory() as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(HOOK)
        log = Path(hook_dir) / "collections.txt"
        env = {**os.environ, "PYTHONPATH": hook_dir, "GC_PAUSES_LOG": str(log)}
        with LiveServer([sys.executable, "server.py", "--port", "{port}", *flags],
                        cwd=args.cwd, env=env) as server:
            bench(server.url, 1)
            began = time.time()
            for _ in range(args.loads):
                bench(server.url, 2)
            ended = time.time()
            server_pid = server.pid
        lines = [line.split() for line in log.read_text().splitlines()]
    found: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for pid, at, generation, took in lines:
        if began <= float(at) <= ended:
            found[int(pid)][int(generation)].append(float(took))
    tokens = args.loads * 2 * 30 * 100
    print(f"{cpu_model()}; server.py {' '.join(flags)} in {args.cwd}; {args.loads} x bench.py "
          f"--users 30 --max-tokens 100 --rounds 2 ({tokens} streamed tokens, "
          f"{ended - began:.1f} s)")
    for pid in sorted(found, key=lambda p: p != server_pid):
        name = "HTTP process" if pid == server_pid else f"process {pid} (engine core)"
        print(name)
        for generation in (0, 1, 2):
            times = found[pid].get(generation, [])
            longest = max(times, default=0.0)
            print(f"  generation {generation}: {len(times)} collections, {sum(times) * 1e3:.1f} "
                  f"ms in all, the longest {longest * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
