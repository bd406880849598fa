"""Does watching the dashboard slow the engine? The same 30-user load, alternately with no
page open and with a subscriber reading /dashboard/events (what the page reads: a real SSE
client that parses every frame), A B A B ... in one run against one server.

A first load, not counted, fills the prefix cache with the prompts every later load sends,
so each counted load starts from the same cache. The subscriber is a coroutine in this
process rather than a headless browser, whose drawing would compete for this machine's
CPU cores and measure the browser rather than the server.

Example (a server on 127.0.0.1:8123, nothing else running):
    python3 benchmarks/studies/dashboard_overhead.py --url http://127.0.0.1:8123 --pairs 3
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import httpx

from benchmarks import bench
from benchmarks.live_server import async_sse_events
from benchmarks.results import (
    DashboardOverheadRun,
    LevelResult,
    Machine,
    OverheadTrial,
    result_path,
)


async def watch(url: str, frames: list[float]) -> None:
    """Read the dashboard's event stream until cancelled, parsing each frame."""
    async with httpx.AsyncClient(timeout=None) as client, client.stream(
            "GET", f"{url}/dashboard/events") as response:
        response.raise_for_status()
        async for _ in async_sse_events(response.aiter_lines()):  # each frame parsed
            frames.append(time.perf_counter())


async def one_load(args: argparse.Namespace, page_open: bool) -> tuple[LevelResult, int]:
    load = argparse.Namespace(url=args.url, users=[args.users], rounds=1, warmup=0,
                              max_tokens=args.max_tokens, system_repeats=0, timeout=600.0,
                              model=None)
    frames: list[float] = []
    watcher = asyncio.create_task(watch(args.url, frames)) if page_open else None
    if watcher is not None:
        await asyncio.sleep(1.0)  # the page is open before the users arrive
    try:
        [level] = await bench.run(load)
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    if page_open and not frames:
        raise RuntimeError("the dashboard's event stream sent no frames")
    return level, len(frames)


def spread_pct(values: list[float]) -> float:
    return 100 * (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 else 0


async def run(args: argparse.Namespace) -> list[OverheadTrial]:
    print("warm-up load (not counted)", file=sys.stderr, flush=True)
    await one_load(args, page_open=False)
    trials = []
    for order in range(2 * args.pairs):
        page_open = order % 2 == 1
        level, frames = await one_load(args, page_open)
        print(f"load {order + 1}: page {'open' if page_open else 'closed'}: "
              f"{level.throughput_tok_s} tok/s, ITL p50 {level.itl_p50_ms} ms, "
              f"{frames} frames in {level.wall_s:.1f} s, errors {level.errors}", flush=True)
        trials.append(OverheadTrial(order + 1, page_open, frames, level))
    return trials


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--pairs", type=int, default=3, help="closed/open pairs of loads")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--label", default="dashboard-overhead")
    args = p.parse_args()
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    trials = asyncio.run(run(args))
    closed = [t.level.throughput_tok_s or 0.0 for t in trials if not t.page_open]
    opened = [t.level.throughput_tok_s or 0.0 for t in trials if t.page_open]
    out = DashboardOverheadRun(
        url=args.url, users=args.users, max_tokens=args.max_tokens, machine=Machine.this_one(),
        started_at=started_at, command="python3 " + shlex.join(sys.argv), trials=trials,
        closed_mean_tok_s=round(statistics.mean(closed), 2),
        open_mean_tok_s=round(statistics.mean(opened), 2),
        difference_pct=round(100 * (statistics.mean(opened) / statistics.mean(closed) - 1), 2),
        noise_pct=round(max(spread_pct(closed), spread_pct(opened)), 2))
    path = result_path(Path(args.results_dir), args.label)
    out.save(path)
    print(f"page closed: {closed} tok/s (mean {out.closed_mean_tok_s})")
    print(f"page open:   {opened} tok/s (mean {out.open_mean_tok_s})")
    print(f"open vs closed: {out.difference_pct:+.2f}%; spread within a kind up to "
          f"{out.noise_pct:.2f}%")
    print(f"saved {path}")
    errors = sum(t.level.errors for t in trials)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
