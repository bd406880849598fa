"""The same load against several servers, one at a time, in turns: this tree against
baseline_server.py, or a change against the checkout before it, measured in one run.

    python3 benchmarks/side_by_side.py OUT LABEL=SERVER_SCRIPT... [--turns N]
        [--server-flags "FLAGS"] [-- BENCH FLAGS...]

Each SERVER_SCRIPT (server.py, baseline_server.py, or /tmp/before/server.py in another
checkout) runs from its own folder with --port, FLAGS and its own flags, if the argument has
any ('proc=server.py --engine-process'); this tree's benchmarks/bench.py
measures it with BENCH FLAGS and saves OUT/LABEL.json, or with --turns N above 1 the turns
A B A B ... as OUT/LABEL-1.json ... OUT/LABEL-N.json. Run nothing else meanwhile.

This tree against the baseline (results/baseline-check/{nano,base}.json):

    python3 benchmarks/side_by_side.py results/baseline-check nano=server.py \\
        base=baseline_server.py -- --users 1 30 --max-tokens 100

Two checkouts alternating, twice each (results/restructure/{before,after}-{1,2}.json):

    git worktree add --detach /tmp/before bd9fa3b && git worktree add --detach /tmp/after 94e210a
    python3 benchmarks/side_by_side.py results/restructure before=/tmp/before/server.py \\
        after=/tmp/after/server.py --turns 2 -- --users 1 30 --max-tokens 100
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.live_server import LiveServer, split_commands

BENCH = Path(__file__).resolve().with_name("bench.py")


def server_arg(text: str) -> tuple[str, Path, list[str]]:
    """'LABEL=SERVER_SCRIPT [FLAGS]' into the label, the script's path and its own flags."""
    label, sep, rest = text.partition("=")
    script, *flags = shlex.split(rest) or [""]
    path = Path(script).resolve()
    if not (sep and label and path.is_file()):
        raise argparse.ArgumentTypeError(f"{text!r}: want LABEL=SERVER_SCRIPT (a file)")
    return label, path, flags


def measure(label: str, script: Path, flags: list[str], out: Path,
            bench_flags: list[str]) -> int:
    """Serve with `script`, run bench.py against it; bench.py's exit status."""
    print(f"=== {label}: {script} {shlex.join(flags)}", file=sys.stderr, flush=True)
    command = [sys.executable, script.name, "--port", "{port}", *flags]
    log = Path(tempfile.gettempdir()) / f"nano-vllm-{label}.log"
    with LiveServer(command, log, cwd=script.parent) as server:
        return subprocess.run([sys.executable, os.path.relpath(BENCH), "--url", server.url,
                               "--label", label, "--results-dir", str(out),
                               *bench_flags]).returncode


def main(argv: list[str] | None = None) -> int:
    ours, bench_flags = split_commands(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s OUT LABEL=SERVER_SCRIPT... [--turns N] "
                                           "[--server-flags FLAGS] [-- BENCH FLAGS...]")
    parser.add_argument("out", type=Path, help="where bench.py saves LABEL.json")
    parser.add_argument("servers", nargs="+", type=server_arg, metavar="LABEL=SERVER_SCRIPT")
    parser.add_argument("--turns", type=int, default=1, help="runs of each server, in turns")
    parser.add_argument("--server-flags", default="", help="flags for every server")
    args = parser.parse_args(ours)
    flags = shlex.split(args.server_flags)
    failed = []
    for turn in range(1, args.turns + 1):
        for label, script, own_flags in args.servers:
            name = label if args.turns == 1 else f"{label}-{turn}"
            if measure(name, script, flags + own_flags, args.out, bench_flags):
                failed.append(name)
    if failed:
        print(f"bench.py failed for {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
