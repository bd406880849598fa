"""Two chat models behind one address against one: what sharing the machine costs, and how
long a request waits when its model has to load first.

    python3 benchmarks/several_models.py [--models a=SmolLM2-135M-Instruct b=gemma-3-270m] \\
        [--users 30] [--tokens 100] [--out-dir results/several_models]

It saves OUT_DIR/CPU.json, CPU the CPU's model in lower case with dashes. Run it on an idle
machine (no other process busy), after a first start of each model (its thread choice
cached).

1. `server.py --model A`: USERS streamed completions at once, all to A (bench.py's
   throughput, TTFT and inter-token latency); then half of USERS on A alone, and half on B
   alone (`server.py --model B`): each model's figures served alone.
2. `server.py --model A --model B`: USERS at once, half to A and half to B; each model's
   figures and both together, to set beside each one's alone.
3. `server.py --model A --model B --max-loaded-models 1`: B is not loaded at start; one
   request to B (TTFT includes its load: the engine process's start and the weights), then
   a second one (TTFT with B loaded).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench import stream_completion, summarize, user_prompt
from benchmarks.live_server import LiveServer
from benchmarks.neighbour import cpu_slug
from benchmarks.results import JsonFile, LevelResult, Machine
from benchmarks.stream_client import open_client

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class SeveralModelsRun(JsonFile):
    """several_models.py: USERS on one model, split across two, and a load's TTFT."""

    machine: Machine
    command: str
    models: list[str]  # NAME=PATH, the first alone in the first server
    users: int
    tokens: int
    started_at: str
    alone: LevelResult  # every user on the first model, served alone
    halves_alone: dict[str, LevelResult]  # half the users on each model, served alone
    split: dict[str, LevelResult]  # each model's half with both served at once, and "both"
    cold_ttft_ms: float | None  # the first request to a model not loaded
    warm_ttft_ms: float | None  # the next one, loaded

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SeveralModelsRun:
        return cls(**{**raw, "machine": Machine(**raw["machine"]),
                      "alone": LevelResult(**raw["alone"]),
                      "halves_alone": {k: LevelResult(**v)
                                       for k, v in raw["halves_alone"].items()},
                      "split": {k: LevelResult(**v) for k, v in raw["split"].items()}})


def server(models: list[str], extra: list[str], log: Path) -> LiveServer:
    command = [sys.executable, "server.py", "--port", "{port}", *extra]
    for model in models:
        command += ["--model", model]
    return LiveServer(command, log, cwd=ROOT, start_timeout=900)


async def users_on(url: str, names: list[str | None], tokens: int,
                   timeout: float) -> tuple[list[Any], float]:
    """One streamed completion per entry of `names` (its model), all at once; the results
    and the wall time."""
    async with open_client("httpx", len(names) + 4, timeout) as client:
        payloads = [{"prompt": user_prompt("", k, k), "max_tokens": tokens, "stream": True,
                     "ignore_eos": True, "temperature": 0,
                     "stream_options": {"include_usage": True},
                     **({"model": name} if name else {})} for k, name in enumerate(names)]
        start = time.perf_counter()
        results = await asyncio.gather(*(stream_completion(
            client, f"{url}/v1/completions", p, timeout) for p in payloads))
        return list(results), time.perf_counter() - start


def ttft_ms(result: Any) -> float | None:
    if result.error or not result.token_times:
        print(f"  error: {result.error}", flush=True)
        return None
    return round((result.token_times[0] - result.send) * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs=2, default=["a=SmolLM2-135M-Instruct",
                                                       "b=gemma-3-270m"], metavar="NAME=PATH")
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                        help="flags for every server (last on the line)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results" / "several_models")
    args = parser.parse_args()
    names = [m.split("=", 1)[0] for m in args.models]
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    log_dir = Path(tempfile.mkdtemp(prefix="several-models-"))
    print(f"server logs in {log_dir}", flush=True)

    half = args.users // 2
    halves_alone = {}
    for i, model in enumerate(args.models):
        with server([model], args.server_args, log_dir / f"alone-{i}.log") as one:
            if i == 0:
                results, wall = asyncio.run(users_on(one.url, [None] * args.users,
                                                     args.tokens, args.timeout))
                alone = summarize(args.users, results, wall)
                print(f"alone ({names[0]}, {args.users} users): {alone}", flush=True)
            results, wall = asyncio.run(users_on(one.url, [None] * half, args.tokens,
                                                 args.timeout))
            halves_alone[names[i]] = summarize(half, results, wall)
            print(f"alone ({names[i]}, {half} users): {halves_alone[names[i]]}", flush=True)

    split_names = [names[k % 2] for k in range(args.users)]
    with server(args.models, args.server_args, log_dir / "split.log") as two:
        results, wall = asyncio.run(users_on(two.url, split_names, args.tokens, args.timeout))
    split = {"both": summarize(args.users, results, wall)}
    for name in names:
        mine = [r for r, n in zip(results, split_names, strict=True) if n == name]
        split[name] = summarize(len(mine), mine, wall)
    for key, level in split.items():
        print(f"split ({key}): {level}", flush=True)

    with server(args.models, [*args.server_args, "--max-loaded-models", "1"],
                log_dir / "load.log") as lazy:
        cold, _ = asyncio.run(users_on(lazy.url, [names[1]], 4, args.timeout))
        warm, _ = asyncio.run(users_on(lazy.url, [names[1]], 4, args.timeout))
    cold_ms, warm_ms = ttft_ms(cold[0]), ttft_ms(warm[0])
    print(f"TTFT of {names[1]}: {cold_ms} ms loading it first, {warm_ms} ms loaded", flush=True)

    run = SeveralModelsRun(Machine.this_one(), " ".join(["python3", *sys.argv]), args.models,
                           args.users, args.tokens, started_at, alone, halves_alone, split,
                           cold_ms, warm_ms)
    run.save(out := args.out_dir / f"{cpu_slug()}.json")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
