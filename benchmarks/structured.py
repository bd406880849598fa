"""Structured outputs and tool calls under load, against a running nano-vLLM server, in one
run. `--constraint json_schema` (completions with a JSON schema) or `--constraint tool`
(chat completions with `tool_choice: "required"` and the schema as the tool's parameters):

1. 30 users at once, each constrained: every answer (or every call's arguments) must parse
   and validate against the schema;
2. throughput of those 30 constrained users beside 30 free users (the same prompts, each
   free user asking for exactly as many tokens as the constrained user of its prompt got,
   so both runs have the same lengths and the same tail);
3. 10 free users streaming, alone and then while a schema with a 1,000-value enum (new to
   the server, so it compiles) is sent: their inter-token latency p99 with and without.

Saves {results_dir}/{label}-*.json (a BenchRun per part, levels named by users) and prints
a summary. Examples:
    python3 benchmarks/structured.py --url http://127.0.0.1:8080 --label structured
    python3 benchmarks/structured.py --url http://127.0.0.1:8080 --label tools --constraint tool
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
import uuid
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import httpx
import jsonschema

from benchmarks.bench import QUESTIONS, UserResult, stream_completion, summarize
from benchmarks.results import BenchRun, LevelResult, Machine, result_path
from benchmarks.stream_client import HttpxStreams

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "mood": {"type": "string", "enum": ["happy", "sad", "calm", "excited"]},
        "place": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20}},
            "required": ["city", "country"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "minItems": 1, "maxItems": 4},
        "summary": {"type": "string", "minLength": 120, "maxLength": 240},
    },
    "required": ["title", "rating", "mood", "place", "tags", "summary"],
    "additionalProperties": False,
}


def enum_schema(values: int, tag: str | None = None) -> dict[str, Any]:
    """`values` words; without a tag a fresh one, so the server has never compiled it."""
    tag = tag or uuid.uuid4().hex[:6]
    return {"type": "object", "properties": {"word": {
        "type": "string", "enum": [f"word_{i:04d}_{tag}" for i in range(values)]}},
        "required": ["word"], "additionalProperties": False}


TOOL_NAME = "record_review"


def payload(prompt: str, max_tokens: int, schema: dict | None, args: argparse.Namespace,
            stream: bool = True, description: str = "Record a review.") -> dict[str, Any]:
    """A completion (json_schema) or chat (tool) request; free (ignore_eos) without a schema.
    A tool's description is in its prompt but not in its grammar."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "stream": stream,
                            "temperature": args.temperature}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if args.constraint == "tool":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if schema is None:
        body["ignore_eos"] = True
    elif args.constraint == "tool":
        body["tools"] = [{"type": "function", "function": {
            "name": TOOL_NAME, "description": description, "parameters": schema}}]
        body["tool_choice"] = "required"
        body["parallel_tool_calls"] = False
    else:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "answer", "schema": schema}}
    if args.model:
        body["model"] = args.model
    return body


def answers(choice: dict[str, Any], constraint: str) -> list[Any]:
    """The JSON values a constrained choice gave: its text, or each tool call's arguments
    (ValueError if there is none to read)."""
    if constraint != "tool":
        return [json.loads(choice["text"])]
    calls = choice["message"].get("tool_calls") or []
    if not calls or choice["finish_reason"] != "tool_calls":
        raise ValueError(f"no tool call (finish_reason {choice['finish_reason']})")
    return [json.loads(call["function"]["arguments"]) for call in calls]


def prompt_for(user: int) -> str:
    return (f"Request {user}. {QUESTIONS[user % len(QUESTIONS)]}\n"
            "Answer as JSON with a title, a rating, a mood, a place, tags and a summary:\n")


async def validity(client: httpx.AsyncClient, url: str, args: argparse.Namespace
                   ) -> dict[str, Any]:
    """Part 1: every answer of 30 concurrent constrained users, parsed and validated."""
    async def one(user: int) -> str | None:
        r = await client.post(url, json=payload(prompt_for(user), args.max_tokens, SCHEMA,
                                                args, stream=False))
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:200]}"
        choice = r.json()["choices"][0]
        try:
            for value in answers(choice, args.constraint):
                jsonschema.validate(value, SCHEMA)
        except (ValueError, jsonschema.ValidationError) as exc:
            return f"{choice['finish_reason']}: {exc.__class__.__name__}: {str(exc)[:120]}"
        return None

    problems = await asyncio.gather(*(one(u) for u in range(args.users)))
    bad = [p for p in problems if p is not None]
    return {"users": args.users, "valid": args.users - len(bad), "first_problem":
            bad[0] if bad else None}


async def level(client: httpx.AsyncClient, url: str, payloads: list[dict[str, Any]],
                timeout: float) -> tuple[list[UserResult], float]:
    start = time.perf_counter()
    streams = HttpxStreams(client)
    results = await asyncio.gather(*(stream_completion(streams, url, p, timeout)
                                     for p in payloads))
    return list(results), time.perf_counter() - start


async def throughput(client: httpx.AsyncClient, url: str, args: argparse.Namespace
                     ) -> tuple[LevelResult, LevelResult]:
    """Part 2: 30 constrained users, then 30 free ones, each as long as its constrained twin."""
    constrained, wall = await level(client, url, [
        payload(prompt_for(u), args.max_tokens, SCHEMA, args) for u in range(args.users)],
        args.timeout)
    with_schema = summarize(args.users, constrained, wall)
    free, wall = await level(client, url, [
        payload(prompt_for(u), max(1, r.tokens), None, args)
        for u, r in enumerate(constrained)], args.timeout)
    return with_schema, summarize(args.users, free, wall)


async def compile_beside_streams(client: httpx.AsyncClient, url: str,
                                 args: argparse.Namespace) -> dict[str, Any]:
    """Part 3: 10 free users alone, then with a new enum schema sent 1 s in. A tool's schema
    is also in its prompt, so in tool mode a third load sends an enum of the same size that
    the server has compiled already: what differs between the last two is the compile. Each
    tool's description is new (a prompt the prefix cache has not seen), so both prefill it
    all."""
    users = args.stream_users

    def free() -> list[dict[str, Any]]:
        return [payload(prompt_for(100 + u), args.stream_tokens, None, args)
                for u in range(users)]

    async def enum_request(tag: str | None, delay: float) -> tuple[float, int, str]:
        await asyncio.sleep(delay)
        start = time.perf_counter()
        r = await client.post(url, json=payload("Pick one word:", 40,
                                                enum_schema(args.enum_values, tag), args,
                                                stream=False,
                                                description=f"Pick ({uuid.uuid4().hex})."))
        return time.perf_counter() - start, r.status_code, r.text[:200]

    async def beside(tag: str | None) -> tuple[LevelResult, tuple[float, int, str]]:
        start = time.perf_counter()
        streams = asyncio.gather(*(stream_completion(HttpxStreams(client), url, p, args.timeout)
                                   for p in free()))
        results, answer = await asyncio.gather(streams, enum_request(tag, 1.0))
        return summarize(users, list(results), time.perf_counter() - start), answer

    alone, wall = await level(client, url, free(), args.timeout)
    out: dict[str, Any] = {"without": summarize(users, alone, wall)}
    if args.constraint == "tool":
        print("known enum (compiled now):", (await enum_request("known", 0))[1:],
              file=sys.stderr)
        out["known"], (known_s, _, _) = await beside("known")
        out["known_request_s"] = round(known_s, 3)
    out["with"], (enum_s, status, body) = await beside(None)
    return {**out, "enum_request_s": round(enum_s, 3), "enum_status": status,
            "enum_body": body}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    path = "/v1/chat/completions" if args.constraint == "tool" else "/v1/completions"
    url = args.url.rstrip("/") + path
    limits = httpx.Limits(max_connections=args.users * 2 + 8, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.timeout)) as client:
        warm = await client.post(url, json=payload("Warm up:", 8, SCHEMA, args, stream=False))
        print("warmup (compiles the schema):", warm.status_code, file=sys.stderr)
        valid = await validity(client, url, args)
        print("validity:", valid, file=sys.stderr)
        with_schema, free = await throughput(client, url, args)
        compile_part = await compile_beside_streams(client, url, args)
    return {"validity": valid, "constrained": with_schema, "free": free, **compile_part}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--label", default="structured")
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=400, help="cap for constrained answers")
    p.add_argument("--stream-users", type=int, default=10)
    p.add_argument("--stream-tokens", type=int, default=100)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--constraint", choices=["json_schema", "tool"], default="json_schema")
    p.add_argument("--enum-values", type=int, default=None,
                   help="of part 3's new schema (default: 1,000 for json_schema, 100 for tool, "
                        "whose schema is also in the prompt)")
    p.add_argument("--temperature", type=float, default=None,
                   help="of every request (default: 0 for json_schema, 0.8 for tool)")
    p.add_argument("--model", default=None)
    p.add_argument("--results-dir", default="results")
    args = p.parse_args()
    if args.temperature is None:
        args.temperature = 0.8 if args.constraint == "tool" else 0.0
    if args.enum_values is None:
        args.enum_values = 100 if args.constraint == "tool" else 1000
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    out = asyncio.run(run(args))
    print_summary(out, args)
    save(out, args, started_at, "python3 " + shlex.join(sys.argv))
    return 0


def print_summary(out: dict[str, Any], args: argparse.Namespace) -> None:
    c, f = out["constrained"], out["free"]
    print(f"1. {out['validity']['valid']}/{out['validity']['users']} constrained answers "
          f"valid (first problem: {out['validity']['first_problem']})")
    print(f"2. constrained {c.throughput_tok_s} tok/s ({c.total_tokens} tokens, {c.wall_s} s), "
          f"free {f.throughput_tok_s} tok/s ({f.total_tokens} tokens, {f.wall_s} s): "
          f"{100 * (c.throughput_tok_s or 0) / (f.throughput_tok_s or 1):.0f}%")
    w, wo = out["with"], out["without"]
    known = out.get("known")
    beside_known = (f", beside the same-size compiled enum {known.itl_p50_ms}/"
                    f"{known.itl_p99_ms} ms" if known else "")
    print(f"3. {args.stream_users} free streams, ITL p50/p99: alone {wo.itl_p50_ms}/"
          f"{wo.itl_p99_ms} ms{beside_known}, beside the new {args.enum_values:,}-value enum "
          f"{w.itl_p50_ms}/{w.itl_p99_ms} ms; the new enum's request took "
          f"{out['enum_request_s']} s (HTTP {out['enum_status']}: {out['enum_body']})")


def save(out: dict[str, Any], args: argparse.Namespace, started_at: str, command: str) -> None:
    """A BenchRun per part, and a summary naming the order of each run's levels."""
    folder = Path(args.results_dir)
    compile_order = ["without", "known", "with"] if "known" in out else ["without", "with"]
    parts = {"throughput": ["constrained", "free"], "enum-compile": compile_order}
    for part, order in parts.items():
        BenchRun(label=f"{args.label}-{part}", url=args.url, max_tokens=args.max_tokens,
                 system_repeats=0, machine=Machine.this_one(), started_at=started_at,
                 command=command, levels=[out[name] for name in order]).save(
            result_path(folder, f"{args.label}-{part}"))
    extra = {"validity": out["validity"], "constraint": args.constraint,
             "temperature": args.temperature, "enum_values": args.enum_values,
             **{key: out[key] for key in ("enum_request_s", "known_request_s", "enum_status",
                                          "enum_body") if key in out},
             "levels_order": parts, "command": command,
             "machine": asdict(Machine.this_one())}
    (folder / f"{args.label}-summary.json").write_text(json.dumps(extra, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
