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
- the server's resident memory grew less than --rss-bound-mib from the end of the warm-up
  (the first --warmup seconds of traffic) to the end;
- SIGTERM then drains it and it exits 0 with nothing in flight.

    python3 -m benchmarks.soak --duration 600 --out results/soak/soak-600s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

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
        finishes, done, error, usage, tokens = [], 0, None, None, 0
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                done += 1
                continue
            if done:
                tally.violation(f"{path} stream: an event after [DONE]")
            event = json.loads(data)
            if "error" in event:
                error = event
                continue
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                tokens += choice.get("text") is not None or "content" in choice.get("delta", {})
                if choice["finish_reason"] is not None:
                    finishes.append(choice["finish_reason"])
            if drop_after is not None and tokens >= drop_after:
                tally.counts["dropped"] += 1
                return  # leaving the block closes the connection mid-stream
    if done != 1:
        tally.violation(f"{path} stream: {done} [DONE] events")
    if error is not None:
        tally.counts["errors"] += 1
        if not is_envelope(error) or finishes:
            tally.violation(f"{path} stream: unclear error {error} after {finishes}")
    elif finishes != ["length"] or usage is None or usage["completion_tokens"] != max_tokens:
        tally.violation(f"{path} stream: finishes {finishes}, usage {usage} (asked {max_tokens})")
    else:
        tally.counts["completed"] += 1
        tally.tokens += max_tokens


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
                  tally: Tally, on_warm: Any, warmup: float) -> None:
    rng = random.Random(seed)
    deadline = time.monotonic() + duration
    warm_at = time.monotonic() + warmup
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

        async def warm() -> None:
            await asyncio.sleep(max(warm_at - time.monotonic(), 0))
            on_warm()

        await asyncio.gather(*(worker(rng.random()) for _ in range(clients)), bursts(), warm())
    tally.counts["requests_started"] = started


def scrape(url: str) -> dict[str, float]:
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "server.py", "--port", str(port), *SERVER_FLAGS],
                            cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the server did not start:\n{log_path.read_text()}")


def wait_idle(url: str, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = (m["nano_vllm:num_requests_running"] == 0
                and m["nano_vllm:num_requests_waiting"] == 0)
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


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
    proc, url = start_server(log_path)
    tally = Tally()
    rss: dict[str, float] = {"start": rss_mib(proc.pid)}
    try:
        before = scrape(url)
        began = time.monotonic()
        asyncio.run(traffic(url, duration, max_requests, clients, seed, tally,
                            lambda: rss.setdefault("warm", rss_mib(proc.pid)), warmup))
        elapsed = time.monotonic() - began
        after = wait_idle(url)
        rss["end"] = rss_mib(proc.pid)
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
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
            rss["end"] - rss.get("warm", rss["end"]) < rss_bound_mib,
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
