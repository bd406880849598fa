"""Several servers up at once, each given the same short load in turn, many turns over: for
small differences (one user's inter-token latency) on a machine whose speed drifts from one
minute to the next, which moves a figure more than the difference between two servers run
one after the other.

    python3 benchmarks/interleaved.py OUT "LABEL=COMMAND"... [--turns N] [-- BENCH FLAGS...]

    python3 benchmarks/interleaved.py results/interleaved-bf16 \\
        "nano-vllm=python3 server.py --port {port} --dtype bfloat16" \\
        "llama-cpp=bash benchmarks/llama_cpp.sh serve bf16 {port}" --turns 10

Each COMMAND ("{port}" in it replaced by a free port) starts before the first turn and runs
from this tree's folder; a server with no request in flight takes no CPU, so the others are
measured as if alone. In every turn each server in order gets benchmarks/bench.py with BENCH
FLAGS (default: --users 1 --max-tokens 100), saved as OUT/LABEL-TURN.json, and every
turn's figures in OUT/interleaved.json. Printed: each server's median over the turns, and
its median ratio to the first server within a turn, the statistic the drift cancels out
of. Run nothing else meanwhile.

Each turn sends prompts no earlier turn sent (bench.py --first-serial; BENCH FLAGS may not
set it): the servers stay up from turn to turn, and one that keeps whole prompts cached would
otherwise answer the second turn's from its cache. llama.cpp's server does (a slot keeps its
last prompt): docs/results.md, *30 users against llama.cpp, interleaved*.

How memory was handed out matters too. On an Intel Xeon VM (family 6, model 167), after runs
that had filled the page cache, the server started first streamed one user's fp32 tokens
12% slower than identical servers started after it, whatever its place in a turn; with the
page cache dropped first, three identical servers agreed within 1%. --drop-caches (root
only) writes the page cache back and drops it before the servers start; swapping the
servers' order in a second run shows what is left of a start-order effect.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.live_server import LiveServer, split_commands
from benchmarks.results import BenchRun, InterleavedRun, Machine, result_path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench.py"
# Turn t numbers its prompts from FIRST_SERIAL + SERIALS_PER_TURN * t: new prompts every
# turn, of the same length in every turn (as many digits), for up to 899 turns of at most
# 1,000 prompts (users x rounds, over all levels).
FIRST_SERIAL, SERIALS_PER_TURN = 100_000, 1_000
DEFAULT_LOAD = ["--users", "1", "--max-tokens", "100"]


def server_arg(text: str) -> tuple[str, list[str]]:
    label, sep, command = text.partition("=")
    words = shlex.split(command)
    if not (sep and label and words and any("{port}" in w for w in words)):
        raise argparse.ArgumentTypeError(f"{text!r}: want LABEL=COMMAND, with {{port}} in it")
    return label, words


def run_turn(label: str, url: str, out: Path, bench_flags: list[str]) -> BenchRun:
    done = subprocess.run([sys.executable, str(BENCH), "--url", url, "--label", label,
                           "--results-dir", str(out), *bench_flags],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"bench.py failed against {label}:\n{done.stderr}")
    return BenchRun.load(result_path(out, label))


def drop_caches() -> None:
    """Write dirty pages back and drop the page cache, dentries and inodes (needs root)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        sys.exit(f"--drop-caches: cannot write /proc/sys/vm/drop_caches ({exc}); run as root")


def main(argv: list[str] | None = None) -> int:
    ours, bench_flags = split_commands(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s OUT LABEL=COMMAND... [--turns N] "
                                           "[-- BENCH FLAGS...]")
    parser.add_argument("out", type=Path, help="where bench.py saves LABEL-TURN.json")
    parser.add_argument("servers", nargs="+", type=server_arg, metavar="LABEL=COMMAND")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the page cache before the servers start (root only)")
    args = parser.parse_args(ours)
    if args.drop_caches:
        drop_caches()
    bench_flags = bench_flags or DEFAULT_LOAD
    if any(flag.startswith("--first-serial") for flag in bench_flags):
        parser.error("--first-serial is set per turn, so that every turn sends new prompts")
    run = InterleavedRun(Machine.this_one(), time.strftime("%Y-%m-%dT%H:%M:%S"), bench_flags,
                         {label: shlex.join(command) for label, command in args.servers},
                         {label: [] for label, _ in args.servers},
                         {label: [] for label, _ in args.servers})
    with ExitStack() as stack:
        urls = {}
        for label, command in args.servers:
            log = Path(tempfile.gettempdir()) / f"nano-vllm-interleaved-{label}.log"
            urls[label] = stack.enter_context(LiveServer(command, log, cwd=ROOT)).url
        for label in urls:  # a first request each: caches warm, kernels loaded
            run_turn(f"{label}-warmup", urls[label], Path(tempfile.mkdtemp()),
                     ["--users", "1", "--max-tokens", "8"])
        for turn in range(1, args.turns + 1):
            for label, url in urls.items():
                new_prompts = ["--first-serial", str(FIRST_SERIAL + SERIALS_PER_TURN * turn)]
                level = run_turn(f"{label}-{turn}", url, args.out,
                                 new_prompts + bench_flags).levels[0]
                run.itl_p50_ms[label].append(level.itl_p50_ms or float("nan"))
                run.throughput_tok_s[label].append(level.throughput_tok_s or float("nan"))
                print(f"turn {turn} {label}: ITL p50 {level.itl_p50_ms:.2f} ms, "
                      f"{level.throughput_tok_s:.1f} tok/s", flush=True)
    run.save(args.out / "interleaved.json")
    first = next(iter(run.itl_p50_ms))
    print(f"\n{run.machine.cpu}; bench.py {shlex.join(bench_flags)}; {args.turns} turns")
    for label, values in run.itl_p50_ms.items():
        line = f"{label}: ITL p50, median of turns {statistics.median(values):.2f} ms"
        if label != first:
            ratios = run.ratios(label, first)
            line += (f"; per turn / {first}: median {statistics.median(ratios):.3f} "
                     f"(range {min(ratios):.3f}-{max(ratios):.3f})")
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
