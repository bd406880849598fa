"""Load test for any OpenAI-compatible /v1/completions server (streaming).

For each concurrency level, that many users start at the same time and each streams one
completion. Reports throughput, time to first token (TTFT), inter-token latency (ITL) and
end-to-end latency, prints a table and saves JSON to {results_dir}/{label}.json.

Example:
    python3 benchmarks/bench.py --url http://127.0.0.1:8080 --label nano-vllm --users 1 10 30 40
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import numpy as np

from benchmarks.live_server import DONE, async_sse_events
from benchmarks.results import BenchRun, LevelResult, Machine, result_path
from benchmarks.stream_client import CLIENTS, Reply, StreamClient, open_client, run_with

# Each user's own question: chosen by user index, so prompts differ after the shared prefix.
QUESTIONS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle stays upright while it is moving, in simple words.",
    "Describe a busy morning market in a small coastal town in spring.",
    "List some good reasons to learn a second language as an adult.",
    "Tell me about the history of the printing press and why it mattered.",
    "Imagine a city on Mars a hundred years from now and describe daily life.",
    "Explain the difference between weather and climate to a curious child.",
    "Write a friendly letter to a neighbour thanking them for their help.",
    "Describe how bread is made, from the field of wheat to the bakery shelf.",
    "What are some simple ways to save energy at home during the winter?",
    "Tell a short fable about a fox, a crow and a very clever tortoise.",
    "Explain why the sky looks blue during the day and red at sunset.",
    "Describe the life cycle of a butterfly, step by step, in plain language.",
    "Write a poem about autumn leaves falling in a quiet city park.",
    "Explain how a library organises its books so that people can find them.",
    "Describe a train journey through the mountains on a snowy evening.",
    "What makes a good team captain? Give a few examples from sports.",
    "Explain how rain forms and why some places get much more of it.",
    "Tell me a story about a robot that learns to paint pictures.",
    "Describe the sounds and smells of a forest after a summer storm.",
    "Explain how a compass works and how sailors used it long ago.",
    "Write a short dialogue between a baker and a customer who lost a cat.",
    "Describe what an astronaut might see when looking back at the Earth.",
    "Give some tips for planting a small vegetable garden on a balcony.",
    "Explain how bees make honey and why they are important for farms.",
    "Tell me about a day in the life of a medieval castle cook.",
    "Describe how a river changes from its source in the hills to the sea.",
    "Write a short speech to welcome new students to a village school.",
    "Explain why cats like to sleep so much during the day.",
    "Describe an old clock shop and the person who repairs the clocks.",
    "What should someone pack for a week of hiking in the mountains?",
    "Explain how a simple electric circuit with a battery and a bulb works.",
    "Tell a story about two friends who build a raft to cross a lake.",
    "Describe the night sky seen from a desert far away from any city.",
    "Explain how vaccines help the body defend itself against illness.",
    "Write a short review of an imaginary restaurant that serves only soup.",
    "Describe the journey of a letter from the post box to its address.",
    "Explain why some animals migrate long distances every single year.",
    "Tell me about a musician who plays the violin on a street corner.",
    "Describe how a small island village prepares for a big storm.",
]

# Sentences for the shared system prompt (~10 tokens each including the "Rule N:" label).
SYSTEM_SENTENCES = [
    "always answer in plain and simple English.",
    "keep every answer polite, calm and friendly.",
    "stay on the topic the user asked about.",
    "prefer short sentences over long ones.",
    "never invent facts that you are unsure about.",
    "explain difficult words when you use them.",
    "give concrete examples whenever they help.",
    "do not repeat the question back to the user.",
]


def system_prompt(repeats: int) -> str:
    """A deterministic shared prefix of `repeats` sentences (~10 tokens each)."""
    return " ".join(
        f"Rule {i + 1}: {SYSTEM_SENTENCES[i % len(SYSTEM_SENTENCES)]}" for i in range(repeats)
    )


def user_prompt(prefix: str, user: int, serial: int) -> str:
    """Shared prefix + this user's question; `serial` keeps prompts unique across levels."""
    question = f"Request {serial}, user {user}: {QUESTIONS[user % len(QUESTIONS)]}"
    return f"{prefix} {question}" if prefix else question


@dataclass
class UserResult:
    send: float = 0.0
    finish: float = 0.0
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None
    text: str = ""  # what was streamed


@dataclass
class Progress:
    users: int
    tokens: int = 0
    done: int = 0
    errors: int = 0


def stream_error(chunk: dict[str, Any]) -> str | None:
    """Return an error message if a stream chunk is an error object."""
    err = chunk.get("error")
    if err is None and chunk.get("object") == "error":
        err = chunk
    if err is None:
        return None
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)


async def stream_completion(
    client: StreamClient, url: str, payload: dict[str, Any], timeout: float,
    progress: Progress | None = None,
) -> UserResult:
    """Send one streaming completion request and time every token event."""
    res = UserResult(send=time.perf_counter())
    usage_tokens: int | None = None
    try:
        async with asyncio.timeout(timeout):
            async with client.stream(url, payload) as reply:
                if reply.status != 200:
                    body = (await reply.body()).decode(errors="replace")[:300]
                    res.error = f"HTTP {reply.status}: {body}"
                else:
                    usage_tokens = await read_stream(reply, res, progress)
    except TimeoutError:
        res.error = f"timeout after {timeout:g} s"
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.finish = time.perf_counter()
    res.tokens = usage_tokens if usage_tokens is not None else len(res.token_times)
    if progress:
        progress.done += 1
        progress.errors += res.error is not None
    return res


async def read_stream(reply: Reply, res: UserResult,
                      progress: Progress | None) -> int | None:
    """Record the text and arrival time of each token event of a 200 stream in `res` (or
    its error); return the completion tokens its usage chunk counted, if it sent one."""
    usage_tokens: int | None = None
    async for chunk in async_sse_events(reply.lines):
        if chunk == DONE:
            return usage_tokens
        now = time.perf_counter()
        if (msg := stream_error(chunk)) is not None:
            res.error = f"stream error: {msg}"
            return usage_tokens
        choices = chunk.get("choices") or []
        text = choices and chunk_text(choices[0])
        if text:
            res.text += text
            res.token_times.append(now)
            if progress:
                progress.tokens += 1
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            usage_tokens = int(usage["completion_tokens"])
    res.error = "stream ended without data: [DONE]"
    return usage_tokens


def chunk_text(choice: dict[str, Any]) -> str:
    """What one stream choice adds: a completion's text, a chat delta's content, or the
    pieces of its tool calls' arguments."""
    if choice.get("text"):
        return choice["text"]
    delta = choice.get("delta") or {}
    if delta.get("content"):
        return delta["content"]
    return "".join((call.get("function") or {}).get("arguments") or ""
                   for call in delta.get("tool_calls") or [])


def make_payload(args: argparse.Namespace, prompt: str, max_tokens: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
        "temperature": 0, "stream_options": {"include_usage": True},
    }
    if args.model:
        payload["model"] = args.model
    return payload


async def report_progress(progress: Progress, tag: str, start: float) -> None:
    while True:
        await asyncio.sleep(2.0)
        print(f"  [{tag}] {time.perf_counter() - start:6.1f} s  tokens={progress.tokens}  "
              f"done={progress.done}/{progress.users}  errors={progress.errors}",
              file=sys.stderr, flush=True)


def pct(values: list[float], q: float, scale: float = 1000.0) -> float | None:
    """Percentile q of values (seconds) in ms, or None when there is no data."""
    return round(float(np.percentile(values, q)) * scale, 2) if values else None


def summarize(users: int, results: list[UserResult], wall: float) -> LevelResult:
    ok = [r for r in results if r.error is None]
    ttft = [r.token_times[0] - r.send for r in results if r.token_times]
    itl = [b - a for r in results for a, b in zip(r.token_times, r.token_times[1:])]
    total = sum(r.tokens for r in results)
    errors = [r.error for r in results if r.error is not None]
    return LevelResult(
        users=users,
        throughput_tok_s=round(total / wall, 2) if wall > 0 else None,
        ttft_p50_ms=pct(ttft, 50), ttft_p99_ms=pct(ttft, 99),
        itl_p50_ms=pct(itl, 50), itl_p99_ms=pct(itl, 99),
        e2e_p50_ms=pct([r.finish - r.send for r in ok], 50),
        total_tokens=total, wall_s=round(wall, 3),
        errors=len(errors), first_error=errors[0] if errors else None,
    )


async def run(args: argparse.Namespace) -> list[LevelResult]:
    url = args.url.rstrip("/") + "/v1/completions"
    prefix = system_prompt(args.system_repeats)
    async with open_client(args.client, max(args.users) + 8, args.timeout) as client:
        for i in range(args.warmup):
            res = await stream_completion(
                client, url, make_payload(args, f"Warmup request {i}: say hello.", 8), args.timeout)
            status = f"error: {res.error}" if res.error else f"{res.tokens} tokens"
            print(f"warmup {i + 1}/{args.warmup}: {res.finish - res.send:.2f} s, {status}",
                  file=sys.stderr, flush=True)
        levels, serial = [], args.first_serial
        for users in args.users:
            results: list[UserResult] = []
            wall = 0.0
            for rnd in range(args.rounds):
                tag = f"{users} users, round {rnd + 1}/{args.rounds}"
                print(f"== {tag}", file=sys.stderr, flush=True)
                payloads = [make_payload(args, user_prompt(prefix, u, serial + u), args.max_tokens)
                            for u in range(users)]
                serial += users
                progress = Progress(users=users)
                reporter = asyncio.create_task(
                    report_progress(progress, tag, time.perf_counter()))
                try:
                    batch = await asyncio.gather(*(
                        stream_completion(client, url, p, args.timeout, progress)
                        for p in payloads))
                finally:
                    reporter.cancel()
                wall += max(r.finish for r in batch) - min(r.send for r in batch)
                results.extend(batch)
            levels.append(summarize(users, results, wall))
    return levels


def print_table(levels: list[LevelResult]) -> None:
    cols: list[tuple[str, Callable[[LevelResult], Any]]] = [
        ("users", lambda lv: lv.users), ("tok/s", lambda lv: lv.throughput_tok_s),
        ("TTFT p50", lambda lv: lv.ttft_p50_ms), ("TTFT p99", lambda lv: lv.ttft_p99_ms),
        ("ITL p50", lambda lv: lv.itl_p50_ms), ("ITL p99", lambda lv: lv.itl_p99_ms),
        ("E2E p50", lambda lv: lv.e2e_p50_ms), ("tokens", lambda lv: lv.total_tokens),
        ("wall s", lambda lv: lv.wall_s), ("errors", lambda lv: lv.errors)]

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    rows = [[fmt(get(lv)) for _, get in cols] for lv in levels]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, (h, _) in enumerate(cols)]
    print("  ".join(h.rjust(w) for (h, _), w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    print("(latencies in ms)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--label", default="nano-vllm", help="name of this run (JSON file name)")
    p.add_argument("--users", type=int, nargs="+", default=[1, 10, 30, 40],
                   help="concurrency levels; each level starts that many users together")
    p.add_argument("--max-tokens", type=int, default=100, help="output tokens per request")
    p.add_argument("--rounds", type=int, default=1, help="repeat each level this many times")
    p.add_argument("--first-serial", type=int, default=0,
                   help="number the prompts from this (each prompt holds its number, so a "
                        "later run against the same server sends new prompts only if it "
                        "starts past the numbers an earlier run used)")
    p.add_argument("--system-repeats", type=int, default=0,
                   help="sentences (~10 tokens each) in the shared system prompt")
    p.add_argument("--results-dir", default="results", help="where to save {label}.json")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--model", default=None, help="value for the 'model' field, if needed")
    p.add_argument("--warmup", type=int, default=1, help="8-token requests sent before measuring")
    p.add_argument("--client", choices=CLIENTS, default="httpx",
                   help="HTTP client: httpx, or aiohttp on uvloop (less CPU per token)")
    args = p.parse_args()
    if min(args.users) < 1 or args.rounds < 1 or args.max_tokens < 1:
        p.error("--users, --rounds and --max-tokens must be positive")
    return args


def recorded_command(argv: list[str]) -> str:
    """The command as a reader runs it from the repository root: this script's path relative
    to it, whatever folder or absolute path started it."""
    script = Path(argv[0]).resolve()
    root = Path(__file__).resolve().parents[1]
    if script.is_relative_to(root):
        argv = [str(script.relative_to(root)), *argv[1:]]
    return "python3 " + shlex.join(argv)


def main() -> int:
    args = parse_args()
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    levels = run_with(args.client, run(args))
    out = BenchRun(label=args.label, url=args.url, max_tokens=args.max_tokens,
                   system_repeats=args.system_repeats, machine=Machine.this_one(),
                   started_at=started_at, command=recorded_command(sys.argv),
                   levels=levels)
    path = result_path(Path(args.results_dir), args.label)
    out.save(path)
    print(f"\n{args.label} @ {args.url}  max_tokens={args.max_tokens}  "
          f"system_repeats={args.system_repeats}  rounds={args.rounds}")
    print_table(levels)
    print(f"saved {path}")
    n_err = sum(lv.errors for lv in levels)
    if n_err:
        print(f"{n_err} request(s) failed; first: "
              f"{next(lv.first_error for lv in levels if lv.errors)}", file=sys.stderr)
    return 1 if n_err else 0


if __name__ == "__main__":
    sys.exit(main())
