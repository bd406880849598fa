"""CPU seconds each process of a served run takes: the HTTP process (per thread), the engine
core process, and the load generator.

    python3 benchmarks/studies/process_cpu.py -- --weights q4_1 --activations int8
    python3 benchmarks/studies/process_cpu.py --users 1 --rounds 10 -- --dtype bfloat16
    python3 benchmarks/studies/process_cpu.py --users 1 --rounds 10 --client aiohttp

Starts server.py with the flags after `--`, warms it with one round of the load, then reads
every process's and thread's CPU time (user + system, /proc/PID/stat) before and after
`benchmarks/bench.py --users 30 --max-tokens 100 --rounds 2` (6,000 streamed tokens; or
--users and --rounds; --client is bench.py's) and prints the differences, and each one per
streamed token. The load generator's share per token leaves its imports out: it is the
measured run's CPU less the warm-up's (one round), over the tokens of the rounds beyond
the first. On a 2-core machine each second the HTTP process and the load generator take
is a second the engine core's threads do not have.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

from benchmarks.live_server import LiveServer
from benchmarks.results import cpu_model
from benchmarks.stream_client import CLIENTS

ROOT = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")
TOKENS = 100  # per request


def cpu_seconds(stat: Path) -> float:
    """utime + stime of one /proc stat file, in seconds (fields 14 and 15; the name, field 2,
    may hold spaces, so count from its closing parenthesis)."""
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def threads(pid: int) -> dict[str, float]:
    """CPU seconds per thread of `pid`, by thread name and id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = ("main thread" if task.name == str(pid)
                else (task / "comm").read_text().strip())
        out[f"{name} ({task.name})"] = cpu_seconds(task / "stat")
    return out


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def bench(url: str, users: int, rounds: int, client: str) -> float:
    """Run the load; the load generator's own CPU seconds (it is a child of this process)."""
    before = os.times()
    subprocess.run([sys.executable, "benchmarks/bench.py", "--url", url, "--users", str(users),
                    "--max-tokens", str(TOKENS), "--rounds", str(rounds), "--client", client,
                    "--results-dir", "/tmp", "--label", "process-cpu"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    after = os.times()
    return (after.children_user - before.children_user
            + after.children_system - before.children_system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client", choices=CLIENTS, default="httpx")
    parser.add_argument("server_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    flags = [f for f in args.server_flags if f != "--"]
    with LiveServer([sys.executable, "server.py", "--port", "{port}", *flags], cwd=ROOT) as srv:
        warm_up = bench(srv.url, args.users, 1, args.client)
        core = children(srv.pid)
        http_before, core_before = threads(srv.pid), [cpu_seconds(Path(f"/proc/{c}/stat"))
                                                      for c in core]
        began = time.monotonic()
        load_generator = bench(srv.url, args.users, args.rounds, args.client)
        wall = time.monotonic() - began
        http_after = threads(srv.pid)
        core_after = [cpu_seconds(Path(f"/proc/{c}/stat")) for c in core]
    tokens = args.users * args.rounds * TOKENS
    print(f"{cpu_model()}, {os.cpu_count()} cores; server.py {' '.join(flags)}; bench.py "
          f"--users {args.users} --max-tokens {TOKENS} --rounds {args.rounds} --client "
          f"{args.client}: {tokens} tokens "
          f"in {wall:.1f} s wall")

    def line(what: str, seconds: float) -> str:
        return f"{what}: {seconds:.2f} s, {seconds / tokens * 1e6:.0f} us a token"

    used = {name: http_after[name] - http_before.get(name, 0.0) for name in http_after}
    print(line("HTTP process", sum(used.values())))
    for name, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
        if seconds >= 0.01:
            print("  " + line(name, seconds))
    print(line("engine core process", sum(core_after) - sum(core_before)))
    print(line("load generator (bench.py, imports included)", load_generator))
    if args.rounds > 1:
        per_token = (load_generator - warm_up) / (tokens - args.users * TOKENS)
        print(f"  beyond its first round: {per_token * 1e6:.0f} us a token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
