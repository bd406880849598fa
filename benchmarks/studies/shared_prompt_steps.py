"""Where the first tokens of users sharing a system prompt go: the engine's steps, alone.

--users prompts of the shared-prompt benchmark (benchmarks/bench.py --system-repeats 50),
added together to the engine core (no HTTP), after one warm-up request. Each step until
every user has its first token: its time, the prompt chunks it computed and the prefix-cache
hits of the users it seated; then the prompt tokens computed in all against the least that
must be (each token once however many prompts begin with the same tokens up to it, as a
cache of single tokens would compute, but each prompt's last token, whose logits are needed),
and the engine's own TTFT p50. Each round puts a new first sentence before the system
prompt, so it starts cold, as the benchmark does.

    python3 benchmarks/studies/shared_prompt_steps.py --rounds 2 [--dtype bfloat16 [--no-amx-sdpa]]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

from benchmarks.bench import system_prompt, user_prompt
from engine.config import EngineConfig
from engine.load import load_engine
from engine.request import Request, SamplingParams


def same_start(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def common_prefix(prompts: list[list[int]]) -> int:
    return min(same_start(prompts[0], p) for p in prompts[1:])


def least_computed(prompts: list[list[int]]) -> int:
    """Tokens computed if each is computed once for all the prompts that begin with the same
    tokens up to it (each prompt's last token always: its logits are needed)."""
    least = 0
    for u, prompt in enumerate(prompts):
        before = max((same_start(prompt, p) for p in prompts[:u]), default=0)
        least += len(prompt) - min(before, len(prompt) - 1)
    return least


def one_round(core, tokenizer, round_: int, users: int) -> None:
    prefix = f"Session {round_}. " + system_prompt(50)
    prompts = [tokenizer(user_prompt(prefix, u, u)).input_ids for u in range(users)]
    shared = common_prefix(prompts)
    least = least_computed(prompts)
    print(f"round {round_}: prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, {shared} shared")
    first: dict[str, float] = {}
    start = time.perf_counter()
    for u, prompt in enumerate(prompts):
        core.add(Request(f"u{u}", prompt, SamplingParams(max_tokens=2, temperature=0,
                                                         ignore_eos=True), lambda _: None))
    scheduler, computed, step = core.scheduler, 0, 0
    while len(first) < users:
        began = time.perf_counter()
        out = scheduler.schedule()
        prompt_chunks = [(rid, s.num_tokens) for rid, s in out.scheduled.items()
                         if s.request.num_computed_tokens < s.request.num_prompt_tokens]
        updates = scheduler.update_from_output(out, core.runner.execute(out))
        now = time.perf_counter()
        computed += sum(n for _, n in prompt_chunks)
        for update in updates:
            if update.new_token_ids:
                first.setdefault(update.request.request_id, now - start)
        print(f"  step {step}: {(now - began) * 1e3:.0f} ms, {out.num_tokens} tokens "
              f"({len(out.scheduled) - len(prompt_chunks)} decodes), prefix hits "
              f"{out.prefix_hit_tokens}, prompt chunks {prompt_chunks}; "
              f"{len(first)} users have a token")
        step += 1
    while core.has_work():
        core.step()
    print(f"round {round_}: {computed} prompt tokens computed (at least {least}), "
          f"TTFT p50 {statistics.median(first.values()) * 1e3:.0f} ms in the engine")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--no-amx-sdpa", action="store_true",
                   help="every prefill chunk through the kernel, also where bf16 SDPA runs on "
                        "AMX (model/attention/paged.py)")
    args = p.parse_args()
    engine = load_engine(EngineConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                      dtype=args.dtype))
    core, tokenizer = engine.core, engine.tokenizer
    attention = core.runner.attention
    if args.no_amx_sdpa:
        attention.amx_sdpa = False
    print(f"{args.dtype}, attention {attention.name}, bf16 chunks to SDPA on AMX: "
          f"{getattr(attention, 'amx_sdpa', False)}")
    core.add(Request("warm-up", tokenizer("Warmup request 0: say hello.").input_ids,
                     SamplingParams(max_tokens=8, temperature=0), lambda _: None))
    while core.has_work():
        core.step()
    for round_ in range(args.rounds):
        one_round(core, tokenizer, round_, args.users)


if __name__ == "__main__":
    main()
