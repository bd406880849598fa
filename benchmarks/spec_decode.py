"""Speculative decoding, A/B: the same server without and then with --speculative-config,
the same workloads against each in one run, streamed through the OpenAI API (bench.py's
client and statistics):

- copy: one user at a time asks for answers that copy from the prompt (repeat a paragraph
  with one change, rewrite it, extract a function, fix a typo, quote a passage);
- free: one user at a time asks for free writing (bench.py's questions);
- 30 users: bench.py's load, 30 users together, 100 tokens each.

Greedy, so both servers must stream identical text; the speculating server's /metrics give
the drafted and accepted tokens of each workload. Run it alone on the machine:

    timeout 1800 python3 benchmarks/spec_decode.py
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import httpx

from benchmarks.bench import QUESTIONS, UserResult, stream_completion, summarize, user_prompt
from benchmarks.live_server import LiveServer, free_port
from benchmarks.results import LevelResult, Machine, SpecDecodeRun, SpecDecodeWorkload, result_path
from benchmarks.stream_client import HttpxStreams, StreamClient

ROOT = Path(__file__).resolve().parents[1]
SPEC_CONFIG = ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
               '"prompt_lookup_min": 2}')

TOWN = ("The river town of Elmsford was founded in 1823 by a group of millers who chose the site "
        "for its steady current. Within a decade the town had three mills, a school, and a "
        "wooden bridge that carried wagons across to the eastern farms. The bridge burned in "
        "1861 and was replaced by a stone arch that still stands today.")
LIGHTHOUSE = ("The lighthouse on Gull Point was built in 1902 and lit by an oil lamp until 1936, "
              "when electricity reached the coast. Its keeper, Margaret Hale, kept a logbook of "
              "every ship that passed, and the logbook is now kept in the town musuem. Visitors "
              "can climb the 112 steps to the lamp room on summer weekends.")
CODE = ("def parse_headers(lines):\n    headers = {}\n    for line in lines:\n        if not line:"
        "\n            break\n        key, _, value = line.partition(':')\n"
        "        headers[key.strip().lower()] = value.strip()\n    return headers\n\n\n"
        "def format_headers(headers):\n    return ''.join(f'{k}: {v}\\r\\n' "
        "for k, v in headers.items())\n")
COPY_TASKS = [
    "Repeat the following paragraph word for word, changing 1823 to 1824:\n\n" + TOWN,
    "Rewrite this paragraph with one change: the town is called Ashford.\n\n" + TOWN,
    "Here is a file:\n\n" + CODE + "\nCopy the function parse_headers exactly.",
    "Fix the spelling mistake in this paragraph and give the whole paragraph back:\n\n"
    + LIGHTHOUSE,
    "Quote the first two sentences of this text exactly:\n\n" + LIGHTHOUSE,
]


def chat_payload(content: str, max_tokens: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "temperature": 0, "stream_options": {"include_usage": True}}


def completion_payload(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0, "stream_options": {"include_usage": True}}


async def spec_counts(client: httpx.AsyncClient, url: str) -> tuple[int, int]:
    """(draft tokens, accepted tokens) so far, from /metrics (0 without speculation)."""
    text = (await client.get(url + "/metrics")).text
    found = dict(re.findall(r"^nano_vllm:spec_decode_(num_\w+?)_total (\S+)$", text, re.M))
    return (int(float(found.get("num_draft_tokens", 0))),
            int(float(found.get("num_accepted_tokens", 0))))


async def one_at_a_time(client: StreamClient, url: str, payloads: list[dict[str, Any]],
                        timeout: float) -> tuple[list[UserResult], float]:
    """Each request alone, one after the other; wall time is the sum of their times."""
    results = []
    for payload in payloads:
        results.append(await stream_completion(client, url + "/v1/chat/completions", payload,
                                               timeout))
    return results, sum(r.finish - r.send for r in results)


async def together(client: StreamClient, url: str, payloads: list[dict[str, Any]],
                   timeout: float) -> tuple[list[UserResult], float]:
    results = await asyncio.gather(*(stream_completion(client, url + "/v1/completions", p,
                                                       timeout) for p in payloads))
    return list(results), max(r.finish for r in results) - min(r.send for r in results)


def workloads(args: argparse.Namespace) -> list[tuple[str, int, list[list[dict[str, Any]]]]]:
    """(name, users, rounds of payloads); the same for both servers."""
    copy = [chat_payload(task, 256) for task in COPY_TASKS]
    free = [chat_payload(q, args.free_tokens) for q in QUESTIONS[:args.free_prompts]]
    load = [[completion_payload(user_prompt("", u, 1000 * r + u), 100)
             for u in range(args.users)] for r in range(args.rounds)]
    return [("copy", 1, [copy] * args.rounds), ("free", 1, [free]),
            (f"{args.users} users", args.users, load)]


async def measure(url: str, args: argparse.Namespace
                  ) -> list[tuple[LevelResult, list[str], tuple[int, int]]]:
    """Each workload against the server at url: its result, texts, and spec counts."""
    limits = httpx.Limits(max_connections=args.users + 8, max_keepalive_connections=None)
    out = []
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.timeout)) as client:
        streams = HttpxStreams(client)
        await stream_completion(streams, url + "/v1/chat/completions",
                                chat_payload("Say hello.", 8), args.timeout)  # warm-up
        for name, users, rounds in workloads(args):
            before = await spec_counts(client, url)
            results: list[UserResult] = []
            wall = 0.0
            for payloads in rounds:
                run = one_at_a_time if users == 1 else together
                batch, seconds = await run(streams, url, payloads, args.timeout)
                results.extend(batch)
                wall += seconds
            after = await spec_counts(client, url)
            level = summarize(users, results, wall)
            print(f"  {name}: {level.throughput_tok_s} tok/s, ITL p50 {level.itl_p50_ms} ms, "
                  f"{level.total_tokens} tokens, drafted/accepted "
                  f"{after[0] - before[0]}/{after[1] - before[1]}", file=sys.stderr, flush=True)
            out.append((level, [r.text for r in results],
                        (after[0] - before[0], after[1] - before[1])))
    return out


def run_server(flags: list[str], args: argparse.Namespace, label: str):
    port = free_port()
    server = LiveServer([sys.executable, "server.py", "--port", "{port}", *flags],
                        f"/tmp/nano-vllm-spec-{label}-{port}.log", port=port, cwd=ROOT,
                        stop_grace=30)
    print("starting:", shlex.join(server.command), file=sys.stderr, flush=True)
    with server:
        return asyncio.run(measure(server.url, args))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server-flags", default="", help="flags for both servers")
    p.add_argument("--speculative-config", default=SPEC_CONFIG)
    p.add_argument("--rounds", type=int, default=2, help="rounds of the copy and load runs")
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--free-prompts", type=int, default=4)
    p.add_argument("--free-tokens", type=int, default=128)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--results-dir", default="results")
    p.add_argument("--label", default="spec-decode")
    args = p.parse_args()
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    flags = shlex.split(args.server_flags)
    without = run_server(flags, args, "off")
    with_spec = run_server([*flags, "--speculative-config", args.speculative_config], args, "on")
    run = SpecDecodeRun(
        started_at=started_at, machine=Machine.this_one(),
        command="python3 " + shlex.join(sys.argv), server_flags=args.server_flags,
        speculative_config=args.speculative_config, workloads=[
            SpecDecodeWorkload(name, users, off[0], on[0], off[1] == on[1], *on[2])
            for (name, users, _), off, on in zip(workloads(args), without, with_spec)])
    print(f"{'workload':>10} {'off tok/s':>10} {'on tok/s':>10} {'speed-up':>9} "
          f"{'ITL p50 off/on ms':>18} {'accepted':>9} identical")
    for w in run.workloads:
        a, b = w.without, w.with_speculation
        ratio = (b.throughput_tok_s or 0) / (a.throughput_tok_s or 1)
        rate = "-" if w.acceptance_rate is None else f"{w.acceptance_rate:.0%}"
        print(f"{w.name:>10} {a.throughput_tok_s:>10} {b.throughput_tok_s:>10} {ratio:>8.2f}x "
              f"{f'{a.itl_p50_ms} / {b.itl_p50_ms}':>18} {rate:>9} {w.identical_text}")
    path = result_path(Path(args.results_dir), args.label)
    run.save(path)
    print("saved", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
