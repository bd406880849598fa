"""One GGUF file served by llama.cpp's llama-server and by server.py, in turns, side by side:
the load of benchmarks/bench.py, one long prompt's TTFT, the seconds to a healthy /health
and the memory each server's processes hold.

    python3 benchmarks/gguf_served.py OUT --model FILE.gguf [--turns 2] [-- BENCH FLAGS]

Each turn starts each server in turn (the order alternates between turns), waits for
/health, sends LONG_PROMPTS prompts of about 1,000 tokens one at a time (max_tokens 1, each
new, so no prefix cache helps) for their TTFT, runs bench.py (default --users 1 30
--max-tokens 100), reads the RSS of the server's processes, and stops it. It saves
OUT/{llama-cpp,nano-vllm}-T.json (bench.py's) and OUT/{...}-T-served.json (the rest). Build
llama-server first (`bash benchmarks/llama_cpp.sh build`); run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

from benchmarks.live_server import LiveServer
from benchmarks.results import Machine, ServedFileRun

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench.py"
LONG_PROMPTS = 3
DEFAULT_BENCH = ["--users", "1", "30", "--max-tokens", "100", "--rounds", "2"]


def llama_server() -> Path:
    binary = Path(subprocess.run(["bash", str(ROOT / "benchmarks" / "llama_cpp.sh"), "bin"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    if not binary.is_file():
        sys.exit(f"no llama-server at {binary}: run bash benchmarks/llama_cpp.sh build")
    return binary


def commands(model: Path) -> dict[str, list[str]]:
    """Each server's command line; {port} is filled in by LiveServer. llama-server as
    benchmarks/llama_cpp.sh runs it: 32 slots, continuous batching, 2 threads."""
    threads = os.environ.get("THREADS", "2")
    return {"llama-cpp": [str(llama_server()), "-m", str(model), "-np", "32", "-cb", "-c",
                          "32768", "-t", threads, "-tb", threads, "--port", "{port}",
                          "--host", "127.0.0.1"],
            "nano-vllm": [sys.executable, "server.py", "--model", str(model), "--port",
                          "{port}"]}


def tree_rss(pid: int) -> int:
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def long_prompt(turn: int, label: str, i: int) -> str:
    """About 1,000 tokens that no earlier request began with."""
    words = " ".join(f"item{j % 97} is {j * 7 % 13}" for j in range(158))
    return f"Request {label} {turn}.{i}: read the list and sum the values. {words}\nSum:"


def long_prompt_ttft(url: str, model: str, prompt: str) -> tuple[float, int]:
    import httpx

    started = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", timeout=600,
                   json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    elapsed = (time.perf_counter() - started) * 1000
    r.raise_for_status()
    return elapsed, int(r.json()["usage"]["prompt_tokens"])


def served_model_name(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def startup_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines()
             if line.startswith("nano-vLLM:") or "KV self size" in line or "llama_kv" in line]
    return lines[0].strip() if lines else ""


def measure(label: str, command: list[str], model: Path, turn: int, out: Path,
            bench_flags: list[str]) -> None:
    print(f"=== {label}, turn {turn}: {' '.join(command)}", file=sys.stderr, flush=True)
    log = Path(tempfile.gettempdir()) / f"gguf-served-{label}.log"
    started = time.perf_counter()
    with LiveServer(command, log, cwd=ROOT, start_timeout=900) as server:
        ready = time.perf_counter() - started
        name = served_model_name(server.url)
        ttfts, tokens = [], 0
        for i in range(LONG_PROMPTS):
            ms, tokens = long_prompt_ttft(server.url, name, long_prompt(turn, label, i))
            ttfts.append(ms)
        rss = tree_rss(server.pid)
        subprocess.run([sys.executable, os.path.relpath(BENCH, ROOT), "--url", server.url,
                        "--label", f"{label}-{turn}", "--results-dir", str(out), "--model",
                        name, *bench_flags], cwd=ROOT, check=True)
    run = ServedFileRun(label, Machine.this_one(),
                        datetime.now(UTC).isoformat(timespec="seconds"),
                        " ".join(command), model.name, model.stat().st_size, round(ready, 1),
                        rss, [round(t, 1) for t in ttfts], tokens, startup_line(log))
    run.save(out / f"{label}-{turn}-served.json")
    print(f"{label}: ready {ready:.1f} s, RSS {rss / 1e9:.2f} GB, long-prompt TTFT "
          f"{statistics.median(ttfts):.0f} ms ({tokens} tokens)", file=sys.stderr)


def main() -> int:
    args = sys.argv[1:]
    bench_flags = DEFAULT_BENCH
    if "--" in args:
        at = args.index("--")
        args, bench_flags = args[:at], args[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--turns", type=int, default=2)
    opts = parser.parse_args(args)
    cmds = commands(opts.model.resolve())
    order = list(cmds)
    for turn in range(1, opts.turns + 1):
        for label in order if turn % 2 else order[::-1]:
            measure(label, cmds[label], opts.model.resolve(), turn, opts.out, bench_flags)
    return 0


if __name__ == "__main__":
    sys.exit(main())

