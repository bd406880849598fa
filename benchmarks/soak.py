"""Soak: mixed, hostile traffic against a real server process, then checks that nothing leaked.

Starts server.py on a free loopback port (small KV pool, few seats, a short waiting line and
a prompt-token cap, priority scheduling), and for --duration seconds (at most --max-requests
requests) keeps --clients clients busy with a random mix: streamed and non-streamed
completions and chats, streams dropped after a few tokens, bad requests, prompts long enough
to force preemption, random priorities, and every few seconds a burst past the queue cap.
Every generation sets ignore_eos, so a request that ends well has exactly max_tokens tokens.

Then, once the server is idle, it checks:
- every accepted request ended exactly once: all its tokens and one finish_reason (streams:
  one per choice, then one [DONE]), or a clear error (the envelope, a stream's error event);
  every refusal is a 429 with a Retry-After, every bad request a 4xx envelope;
- no KV block leaked: none used, free + cached-free = total;
- /metrics agrees with the client: finished requests by reason equal the client's counts
  (length = completed, abort = dropped streams, error = errors seen);
- the server's resident memory (its process and the engine core process beside it) grew
  less than --rss-bound-mib from the end of the warm-up
  (the first --warmup seconds of traffic) to the end; traffic that ends within the warm-up
  measures nothing, which fails;
- SIGTERM then drains it and it exits 0 with nothing in flight.

    python3 -m benchmarks.soak --duration 600 --out results/soak/soak-600s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import httpx

from benchmarks.live_server import DONE, LiveServer, async_sse_events

ROOT = Path(__file__).resolve().parents[1]
MAX_WAIT = 10  # seconds a refused client waits at most before its next request
SERVER_FLAGS = ["--num-blocks", "48", "--max-num-seqs", "6", "--max-waiting", "12",
                "--max-num-queued-tokens", "1500", "--scheduling-policy", "priority",
                "--priority-aging", "5", "--shutdown-timeout", "10"]
WORDS = ["the", "cat", "sat", "on", "a", "warm", "mat", "while", "rain", "fell", "over",
         "quiet", "hills", "and", "old", "towns"]
BAD_REQUESTS: list[tuple[str, Any]] = [  # (path, body): each must be refused with a 4xx
    ("/v1/completions", b"{not json"),
    ("/v1/completions", {"prompt": "Hi", "temperature": -1}),
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": "Hi", "model": "no-such-model"}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**6}),
    ("/v1/completions", {"prompt": "Hi", "priority": "high"}),
    ("/v1/completions", {"prompt": [10**9]}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "Hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 0}),
]


class Tally:
    """What the clients saw, and every broken promise."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.tokens = 0  # completion tokens of requests that completed
        self.violations: list[str] = []

    def violation(self, what: str) -> None:
        self.counts["violations"] += 1
        if len(self.violations) < 50:
            self.violations.append(what)


def is_envelope(body: Any) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"}
            and {"message", "type", "param", "code"} <= set(body["error"])
            and bool(body["error"]["message"]))


def prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def generation_body(rng: random.Random, chat: bool, words: int, max_tokens: int) -> dict:
    body: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True,
                            "temperature": rng.choice([0, 0.8]), "priority": rng.randint(-5, 5)}
    text = prompt(rng, words)
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


async def refused(r: httpx.Response, tally: Tally, what: str, wait: bool = True) -> bool:
    """Count a refusal (a 429 with a Retry-After); True if `r` was one. With `wait`, the
    client then waits as told (up to MAX_WAIT), as a well-behaved client does."""
    if r.status_code != 429:
        return False
    tally.counts["refused_429"] += 1
    body = json.loads(await r.aread())
    retry = r.headers.get("Retry-After", "")
    if not (is_envelope(body) and retry.isdigit() and int(retry) >= 1):
        tally.violation(f"{what}: 429 without envelope or Retry-After: {body} {retry!r}")
    elif wait:
        tally.counts["retry_after_seconds"] += int(retry)
        await asyncio.sleep(min(int(retry), MAX_WAIT))
    return True


async def plain(client: httpx.AsyncClient, rng: random.Random, tally: Tally, chat: bool,
                words: int, max_tokens: int, wait: bool = True) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = await client.post(path, json=generation_body(rng, chat, words, max_tokens))
    if await refused(r, tally, path, wait):
        return
    body = r.json()
    if r.status_code != 200:
        tally.counts["errors"] += 1
        if not is_envelope(body):
            tally.violation(f"{path}: {r.status_code} without an envelope: {body}")
        return
    choice = body["choices"][0]
    if choice["finish_reason"] != "length" or body["usage"]["completion_tokens"] != max_tokens:
        tally.violation(f"{path}: {choice['finish_reason']}, {body['usage']} "
                        f"(asked {max_tokens})")
    tally.counts["completed"] += 1
    tally.tokens += max_tokens


@dataclass
class StreamSeen:
    """What one stream sent: its finish reasons, [DONE] events, error event and usage."""

    finishes: list[str] = field(default_factory=list)
    done: int = 0
    error: dict | None = None
    usage: dict | None = None
    tokens: int = 0  # token events
    after_done: bool = False  # an event came after [DONE]


async def read_stream(r: httpx.Response, drop_after: int | None) -> StreamSeen | None:
    """The stream's events, or None once it was dropped after `drop_after` token events."""
    seen = StreamSeen()
    async for event in async_sse_events(r.aiter_lines()):
        if event == DONE:
            seen.done += 1
            continue
        seen.after_done |= seen.done > 0
        if "error" in event:
            seen.error = event
            continue
        seen.usage = event.get("usage") or seen.usage
        for choice in event["choices"]:
            seen.tokens += choice.get("text") is not None or "content" in choice.get("delta", {})
            if choice["finish_reason"] is not None:
                seen.finishes.append(choice["finish_reason"])
        if drop_after is not None and seen.tokens >= drop_after:
            return None  # leaving the caller's block closes the connection mid-stream
    return seen


def judge_stream(path: str, seen: StreamSeen, max_tokens: int, tally: Tally) -> None:
    """Count a stream read to its end; a violation unless it kept every promise."""
    if seen.after_done:
        tally.violation(f"{path} stream: an event after [DONE]")
    if seen.done != 1:
        tally.violation(f"{path} stream: {seen.done} [DONE] events")
    usage = seen.usage
    if seen.error is not None:
        tally.counts["errors"] += 1
        if not is_envelope(seen.error) or seen.finishes:
            tally.violation(f"{path} stream: unclear error {seen.error} after {seen.finishes}")
    elif (seen.finishes != ["length"] or usage is None
          or usage["completion_tokens"] != max_tokens):
        tally.violation(f"{path} stream: finishes {seen.finishes}, usage {usage} "
                        f"(asked {max_tokens})")
    else:
        tally.counts["completed"] += 1
        tally.tokens += max_tokens


async def streamed(client: httpx.AsyncClient, rng: random.Random, tally: Tally, chat: bool,
                   words: int, max_tokens: int, drop_after: int | None = None) -> None:
    """A stream, read to its end, or dropped after `drop_after` token events."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = generation_body(rng, chat, words, max_tokens)
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", path, json=body) as r:
        if await refused(r, tally, path):
            return
        if r.status_code != 200:
            tally.counts["errors"] += 1
            if not is_envelope(json.loads(await r.aread())):
                tally.violation(f"{path} stream: {r.status_code} without an envelope")
            return
        seen = await read_stream(r, drop_after)
        if seen is None:
            tally.counts["dropped"] += 1
            return
    judge_stream(path, seen, max_tokens, tally)


async def bad(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    path, body = rng.choice(BAD_REQUESTS)
    if isinstance(body, bytes):
        r = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = await client.post(path, json=body)
    tally.counts["bad_4xx"] += 1
    if not (400 <= r.status_code < 500 and is_envelope(r.json())):
        tally.violation(f"bad request {body!r} -> {r.status_code} {r.text[:200]}")


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    kind = rng.choices(["stream", "plain", "drop", "bad", "long"], [35, 30, 10, 5, 20])[0]
    chat = rng.random() < 0.4
    if kind == "stream":
        await streamed(client, rng, tally, chat, rng.randint(3, 30), rng.randint(4, 24))
    elif kind == "plain":
        await plain(client, rng, tally, chat, rng.randint(3, 30), rng.randint(4, 24))
    elif kind == "drop":  # long enough that the server is still generating when it goes
        await streamed(client, rng, tally, chat, 5, 300, drop_after=rng.randint(1, 4))
    elif kind == "bad":
        await bad(client, rng, tally)
    else:  # 250-400 prompt tokens and 120 new: a few of these overflow the 48-block pool
        await rng.choice([plain, streamed])(client, rng, tally, False, rng.randint(250, 400),
                                            120)


async def traffic(url: str, duration: float, max_requests: int, clients: int, seed: int,
                  tally: Tally, on_warm: Callable[[], None], warmup: float) -> None:
    rng = random.Random(seed)
    deadline = time.monotonic() + duration
    started = 0
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker(seed: int) -> None:
            nonlocal started
            wrng = random.Random(seed)
            while time.monotonic() < deadline and started < max_requests:
                started += 1
                try:
                    await one_request(client, wrng, tally)
                except Exception as exc:  # a transport error, a body that is not JSON, ...
                    tally.violation(f"{type(exc).__name__}: {exc}")

        async def bursts() -> None:
            nonlocal started
            brng = random.Random(seed + 1)
            while time.monotonic() < deadline and started < max_requests:
                await asyncio.sleep(brng.uniform(4, 8))
                tally.counts["bursts"] += 1
                burst = [plain(client, random.Random(brng.random()), tally, False, 5, 4,
                               wait=False) for _ in range(30)]
                started += len(burst)
                await asyncio.gather(*burst)

        load = asyncio.gather(*(worker(rng.random()) for _ in range(clients)), bursts())
        await sample_when_warm(load, warmup, on_warm)
    tally.counts["requests_started"] = started


async def sample_when_warm(load: Awaitable[Any], warmup: float,
                           on_warm: Callable[[], None]) -> None:
    """Await `load`, calling `on_warm` once it has run for `warmup` seconds; a load that
    ends sooner leaves no warm-up sample."""
    load = asyncio.ensure_future(load)
    finished, _ = await asyncio.wait({load}, timeout=warmup)
    if not finished:
        on_warm()
    await load


def scrape(url: str) -> dict[str, float]:
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def rss_mib(pid: int) -> float:
    """The resident memory of `pid` and its child processes (the engine core's)."""
    total = 0.0
    for child in [pid, *children(pid)]:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except FileNotFoundError:  # exited meanwhile
            continue
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        total += int(found[1]) / 1024 if found else 0.0
    return total


def children(pid: int) -> list[int]:
    """The ids of `pid`'s child processes (from each process's parent id in /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def wait_idle(url: str, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = (m["nano_vllm:num_requests_running"] == 0
                and m["nano_vllm:num_requests_waiting"] == 0)
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def rss_grew_less_than(rss: dict[str, float], bound_mib: float) -> bool:
    """Growth from the warm-up sample to the end; without a warm-up sample nothing was
    measured, which fails."""
    return "warm" in rss and rss["end"] - rss["warm"] < bound_mib


def reasons(m: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    out = {}
    for reason in ("length", "stop", "abort", "error"):
        key = f'nano_vllm:request_success_total{{finished_reason="{reason}"}}'
        out[reason] = int(m.get(key, 0) - before.get(key, 0))
    return out


def run(duration: float, max_requests: int = 100_000, clients: int = 10, seed: int = 0,
        warmup: float = 20.0, rss_bound_mib: float = 100.0,
        log_path: Path = Path("/tmp/nano_vllm_soak_server.log")) -> dict[str, Any]:
    """The soak; returns the report (report["passed"] says whether every check held)."""
    tally = Tally()
    command = [sys.executable, "server.py", "--port", "{port}", *SERVER_FLAGS]
    with LiveServer(command, log_path, cwd=ROOT) as server:
        url, pid = server.url, server.pid
        rss: dict[str, float] = {"start": rss_mib(pid)}
        before = scrape(url)
        began = time.monotonic()
        asyncio.run(traffic(url, duration, max_requests, clients, seed, tally,
                            lambda: rss.setdefault("warm", rss_mib(pid)), warmup))
        elapsed = time.monotonic() - began
        after = wait_idle(url)
        rss["end"] = rss_mib(pid)
        exit_code = server.stop(grace=60)  # SIGTERM: it drains, then exits
    log = log_path.read_text()
    stopped = re.search(r"stopped: (\d+) requests in flight; KV blocks used (\d+), free (\d+), "
                        r"cached-free (\d+) of (\d+)", log)
    by_reason = reasons(after, before)
    c = tally.counts
    blocks = {k: int(after[f"nano_vllm:kv_blocks_{k}"])
              for k in ("total", "used", "free", "cached_free")}
    checks = {
        "no broken promise (tokens, finish, [DONE], envelopes)": c["violations"] == 0,
        "no block leaked: none used, free + cached-free = total":
            blocks["used"] == 0 and blocks["free"] + blocks["cached_free"] == blocks["total"],
        "/metrics length == client's completed": by_reason["length"] == c["completed"],
        "/metrics abort == client's dropped streams": by_reason["abort"] == c["dropped"],
        "/metrics error == client's errors": by_reason["error"] == c["errors"],
        "/metrics stop == 0 (ignore_eos everywhere)": by_reason["stop"] == 0,
        f"RSS growth after warm-up < {rss_bound_mib:g} MiB":
            rss_grew_less_than(rss, rss_bound_mib),
        "SIGTERM: exit 0, nothing in flight, no block held": exit_code == 0 and bool(stopped)
            and stopped[1] == "0" and stopped[2] == "0",
        "traffic really was mixed": all(c[k] > 0 for k in ("completed", "dropped", "bad_4xx",
                                                         "refused_429")),
    }
    preemptions = int(after["nano_vllm:num_preemptions_total"]
                      - before["nano_vllm:num_preemptions_total"])
    return {"duration_s": round(elapsed, 1), "clients": clients, "seed": seed,
            "server_flags": SERVER_FLAGS, "client_counts": dict(c), "tokens": tally.tokens,
            "metrics_by_reason": by_reason, "preemptions": preemptions, "blocks_idle": blocks,
            "rss_mib": {k: round(v, 1) for k, v in rss.items()},
            "exit_code": exit_code, "violations": tally.violations,
            "checks": checks, "passed": all(checks.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60, help="seconds of traffic")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=float, default=20,
                        help="seconds of traffic before the RSS baseline is taken")
    parser.add_argument("--rss-bound-mib", type=float, default=100)
    parser.add_argument("--out", type=Path, default=None, help="save the report as JSON")
    args = parser.parse_args()
    report = run(args.duration, args.max_requests, args.clients, args.seed, args.warmup,
                 args.rss_bound_mib)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
