"""What a busy neighbour costs a decode step, and what giving it the core back buys.

    python3 benchmarks/neighbour.py [--out-dir results/neighbour] [--batches 1 30]

It saves OUT_DIR/CPU.json, CPU the CPU's model in lower case with dashes.

One engine, no HTTP (the default model in fp32 unless --model/--dtype say otherwise). Its
decode steps of each batch size are timed with every thread (as --no-yield-cores runs) and
with the engine's default (a step uses the cores other processes leave free,
engine/cpu_load.py), first on the idle machine, then beside processes that each keep a
core busy (one fewer than the cores), in turns, ROUNDS times: the median step of each.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import Machine, NeighbourRun, NeighbourStep, cpu_model
from engine import thread_choice
from engine.config import EngineConfig
from engine.cpu_load import ContentionWatch
from engine.load import load_engine

ROUNDS = 5


def step_ms(core, batch: int, watch: ContentionWatch | None) -> list[float]:
    """Decode steps of `batch` sequences on all threads, capped by `watch` if given."""
    policy = core.runner.threads
    policy.single_below = 0
    with thread_choice.timing_steps(core):
        policy.watch = watch  # timing_steps puts the engine's own back after
        thread_choice._timed_steps(core, batch)  # the watch sees the machine as it is now
        return thread_choice._timed_steps(core, batch)


def cpu_slug() -> str:
    """This CPU's model as a file name: "AMD EPYC (family 25, model 17)" ->
    "amd-epyc-family-25-model-17"."""
    return re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path,
                        default=Path(__file__).resolve().parents[1] / "results" / "neighbour")
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 30])
    args = parser.parse_args()
    engine = load_engine(EngineConfig(model=args.model, dtype=args.dtype, single_thread_below=0,
                                      max_num_seqs=max(args.batches)))
    core = engine.core
    threads = core.runner.threads.max_threads
    spinners_wanted = len(os.sched_getaffinity(0)) - 1
    rows: list[NeighbourStep] = []
    for neighbour in ("idle", "busy"):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(spinners_wanted if neighbour == "busy" else 0)]
        try:
            time.sleep(0.5)
            for batch in args.batches:
                times: dict[str, list[float]] = {"all threads": [], "yield cores": []}
                for _ in range(ROUNDS):
                    times["all threads"] += step_ms(core, batch, None)
                    watch = ContentionWatch(threads)  # a fresh one: no reading from before,
                    time.sleep(watch.interval)  # and one reading's interval of the machine now
                    times["yield cores"] += step_ms(core, batch, watch)
                for mode, samples in times.items():
                    rows.append(NeighbourStep(neighbour, batch, mode,
                                              round(statistics.median(samples), 2)))
                    print(rows[-1], flush=True)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
    NeighbourRun(Machine.this_one(), " ".join(["python3", *sys.argv]),
                 args.model or "SmolLM2-135M-Instruct", args.dtype, threads, spinners_wanted,
                 ROUNDS, rows).save(out := args.out_dir / f"{cpu_slug()}.json")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
