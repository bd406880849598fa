"""How long a server takes to answer /health: its first start on a machine, then a later one.

    python3 benchmarks/startup.py OUT LABEL=SERVER_SCRIPT...

The first start has an empty kernel cache (TORCH_EXTENSIONS_DIR: the CPU kernels compile) and
no cached thread choice (NANO_THREADS_CACHE: the engine core measures it), which is what a
fresh machine pays once the model is prepared; the later start reuses both. Each
SERVER_SCRIPT (server.py, or /tmp/before/server.py in another checkout) runs from its own
folder, one at a time, and OUT/LABEL.json records both times. Run nothing else meanwhile.

With --fresh-model the first start also finds no prepared model (an empty NANO_VLLM_CACHE:
the default model's wheel is fetched and converted), as on a machine that never ran one.

Two checkouts, before and after a change (results/startup-intel/{before,after}.json):

    git worktree add --detach /tmp/before 4bf7217
    python3 benchmarks/startup.py results/startup-intel before=/tmp/before/server.py \\
        after=server.py
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.live_server import LiveServer
from benchmarks.results import Machine, StartupRun
from benchmarks.side_by_side import server_arg


def seconds_to_health(script: Path, flags: list[str], env: dict[str, str], log: Path) -> float:
    """Start the server, wait for /health, stop it; the seconds it took to answer."""
    command = [sys.executable, script.name, "--port", "{port}", *flags]
    with LiveServer(command, log, cwd=script.parent, env=env, start_timeout=900) as server:
        assert server.startup_s is not None
        return server.startup_s


def measure(label: str, script: Path, flags: list[str], fresh_model: bool) -> StartupRun:
    """Two starts of `script` with caches of their own: the first compiles the kernels and
    measures the thread choice into them (with `fresh_model`, it also fetches and prepares
    the default model), the later one reads them all."""
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix=f"startup-{label}-") as scratch:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(Path(scratch) / "kernels"),
               "NANO_THREADS_CACHE": str(Path(scratch) / "thread-choices.json")}
        if fresh_model:
            env["NANO_VLLM_CACHE"] = str(Path(scratch) / "models")
        logs = Path(tempfile.gettempdir())
        first = seconds_to_health(script, flags, env, logs / f"nano-vllm-startup-{label}-first.log")
        later = seconds_to_health(script, flags, env, logs / f"nano-vllm-startup-{label}-later.log")
    print(f"{label}: first start {first:.1f} s, later start {later:.1f} s", flush=True)
    return StartupRun(label, Machine.this_one(), started_at, "python3 " + shlex.join(sys.argv),
                      round(first, 1), round(later, 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for LABEL.json")
    parser.add_argument("servers", nargs="+", type=server_arg, metavar="LABEL=SERVER_SCRIPT")
    parser.add_argument("--fresh-model", action="store_true",
                        help="the first start also fetches and prepares the default model "
                             "(an empty NANO_VLLM_CACHE): a fresh machine's whole first start")
    args = parser.parse_args()
    for label, script, flags in args.servers:
        measure(label, script, flags, args.fresh_model).save(args.out / f"{label}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
