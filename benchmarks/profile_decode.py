"""Where one decode step's time goes, by part of the model, measured with torch.profiler.

    python3 benchmarks/profile_decode.py --users 1 10 30 --contexts 100 1000 2000

For each (users, context) it builds the engine's own pieces (the model, a KV pool, the block
allocator and its manager, ModelRunner), gives every user the blocks of `context` tokens,
filled with random K/V as if those tokens were computed already, and runs real decode steps
through the runner: first unprofiled, for the step time and tokens/s, then under
torch.profiler. For the profile only, hooks on the model's modules open a named scope around
each part (`part_of`), and the attention the runner hands the model is wrapped in one too;
no file of the model or the engine changes. A part's time is the CPU time of its scopes less
that of the parts nested in them, so the parts add up to the profiled step:

- step setup: the runner's own work around the model (input tensors, attention metadata);
- embedding, norms, qkv, attention (K/V write and attention over the cache), o_proj,
  mlp (both matmuls and the SiLU), lm head: their modules' forward;
- rest of the model: what the model does between them (RoPE, residual adds, reshapes);
- sampling.

The model runs layer by layer from Python here (the engine's decode steps run every layer
in one C++ call where they can, model/decode_stack.py): the parts are the modules' calls.

The profiler costs some microseconds per op it records, so the profiled step (the sum of
parts) is slower than the unprofiled one (the decode step row: the model run and sampling),
each part by about its number of ops. On a GPU the profile's times are the CPU's (launching
kernels), not the kernels' own; the unprofiled step waits for the device, so it is real
everywhere.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # see benchmarks/__init__.py

import torch
from torch import nn
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.results import Machine, OpTime, ProfileCell, ProfileRun
from benchmarks.tables import profile_table, top_ops_table
from engine.model_runner import ModelRunner
from engine.request import Request, SamplingParams
from engine.step_types import SequenceStep
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks, blocks_for
from kvcache.pool import KVCachePool
from model.loader import load_model, pick_device, pick_dtype
from model.prepare import resolve_model_dir

STEP, MODEL, ATTENTION, SAMPLING = "decode step", "model", "attention", "sampling"
# Rows of the table, in order. The two outer scopes are rows by their own time alone.
ROWS = {STEP: "step setup", "embedding": "embedding", "norms": "norms", "qkv": "qkv",
        ATTENTION: "attention", "o_proj": "o_proj", "mlp": "mlp", "lm head": "lm head",
        MODEL: "rest of the model", SAMPLING: "sampling"}
MODULE_PARTS = {"embed_tokens": "embedding", "qkv_proj": "qkv", "o_proj": "o_proj",
                "lm_head": "lm head"}
TOP_OPS = 8
GREEDY = Request("profile", [0], SamplingParams(temperature=0), on_output=lambda _: None)


# The only two functions that know how the runner is asked for a step: when
# the runner's interface changes, they change.
def decode_batch(tables: list[list[list[int]]], token_ids: list[int],
                 start_pos: int) -> list[SequenceStep]:
    """Every user decodes one token at `start_pos`, after start_pos cached tokens."""
    return [SequenceStep([token], start_pos, table, need_logits=True)
            for token, table in zip(token_ids, tables)]


def run_decode_step(runner: ModelRunner, batch: list[SequenceStep]) -> list[int]:
    """One step's model work as ModelRunner.execute does it: run the model, then sample."""
    logits = runner.compute_logits(batch)
    with record_function(SAMPLING):
        return runner.sampler(logits, [GREEDY] * len(batch))


def part_of(name: str, module: nn.Module) -> str | None:
    """The part a module's forward belongs to, from names the model keeps across rewrites."""
    if type(module).__name__ == "RMSNorm":
        return "norms"
    if hasattr(module, "gate_up_proj") and hasattr(module, "down_proj"):
        return "mlp"
    return MODULE_PARTS.get(name.rsplit(".", 1)[-1])


@dataclass
class Scoped:
    """A callable that runs inside a profiler scope."""

    name: str
    fn: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with record_function(self.name):
            return self.fn(*args, **kwargs)


def scope_attention(_model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The model takes its attention as an argument (AttentionFn, model/llama.py), the only
    callable one: hand it the runner's own, wrapped in the attention scope."""
    def wrap(arg: Any) -> Any:
        return Scoped(ATTENTION, arg) if callable(arg) else arg

    return tuple(map(wrap, args)), {key: wrap(value) for key, value in kwargs.items()}


@contextmanager
def part_scopes(model: nn.Module) -> Iterator[None]:
    """While open, each part of the model's forward runs inside a record_function scope."""
    open_scopes: list[record_function] = []

    def opener(part: str) -> Callable[[nn.Module, tuple], None]:
        def enter(_module: nn.Module, _args: tuple) -> None:
            scope = record_function(part)
            scope.__enter__()
            open_scopes.append(scope)
        return enter

    def close(_module: nn.Module, _args: tuple, _output: Any) -> None:
        open_scopes.pop().__exit__(None, None, None)

    parts = [(module, part) for name, module in model.named_modules()
             if (part := part_of(name, module)) is not None]
    handles = [model.register_forward_pre_hook(scope_attention, with_kwargs=True)]
    for module, part in [(model, MODEL), *parts]:
        handles += [module.register_forward_pre_hook(opener(part)),
                    module.register_forward_hook(close)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def own_times_us(events: list[FunctionEvent]) -> dict[str, float]:
    """CPU µs per scope name in ROWS: its scopes' time less that of the scopes nested in them."""
    own: dict[str, float] = defaultdict(float)
    for event in events:
        if event.name not in ROWS:
            continue
        own[event.name] += event.cpu_time_total
        parent = event.cpu_parent
        while parent is not None and parent.name not in ROWS:
            parent = parent.cpu_parent
        if parent is not None:
            own[parent.name] -= event.cpu_time_total
    return own


def top_ops(prof: profile, steps: int) -> list[OpTime]:
    ops = [op for op in prof.key_averages() if op.key not in ROWS]
    ops.sort(key=lambda op: op.self_cpu_time_total, reverse=True)
    return [OpTime(op.key, op.count / steps, op.self_cpu_time_total / steps / 1000)
            for op in ops[:TOP_OPS]]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def run_steps(runner: ModelRunner, batches: list[list[SequenceStep]]) -> float:
    """Seconds for all the batches, one step each, waiting for the device at both ends."""
    synchronize(runner.device)
    start = time.perf_counter()
    for batch in batches:
        with record_function(STEP):
            run_decode_step(runner, batch)
    synchronize(runner.device)
    return time.perf_counter() - start


@torch.inference_mode()
def profile_cell(model: nn.Module, users: int, context: int, steps: int,
                 attention: str) -> ProfileCell:
    cfg = model.cfg
    weight = model.norm.weight
    per_user = context + 2 * steps + 1  # a warm-up step, the timed steps, the profiled steps
    num_blocks = 1 + users * blocks_for(per_user)  # block 0 is the pool's dummy
    pool = KVCachePool(cfg.num_layers, num_blocks, cfg.num_kv_heads, cfg.head_dim,
                       weight.dtype, weight.device)
    for t in pool.k + pool.v:  # as if every user had `context` tokens computed already
        t.normal_()
    kv = KVCacheManager(BlockAllocator(num_blocks, enable_prefix_cache=False))
    tables = []
    for _ in range(users):
        blocks = SequenceBlocks()
        assert kv.allocate_slots(blocks, per_user)
        tables.append(blocks.tables)
    # Layer by layer: the decode stack (model/decode_stack.py) runs every layer in one C++
    # call, where the hooks that name the parts cannot see.
    runner = ModelRunner(model, pool, attention, decode_stack=False)
    token_ids = [(17 * u + 5) % cfg.vocab_size for u in range(users)]
    batches = [decode_batch(tables, token_ids, context + s) for s in range(2 * steps + 1)]

    run_steps(runner, batches[:1])  # warm-up
    step_s = run_steps(runner, batches[1:steps + 1]) / steps
    with part_scopes(model), profile(activities=[ProfilerActivity.CPU]) as prof:
        run_steps(runner, batches[steps + 1:])
    own_us = own_times_us(prof.events())
    for scope in ROWS.keys() - own_us.keys():
        print(f"warning: nothing ran in the {scope!r} scope: has the model renamed the "
              "module it hooks?", file=sys.stderr)
    parts_ms = {row: own_us.get(scope, 0.0) / steps / 1000 for scope, row in ROWS.items()}
    return ProfileCell(users=users, context=context, attention=runner.attention_backend,
                       parts_ms=parts_ms, sum_of_parts_ms=sum(parts_ms.values()),
                       step_ms=step_s * 1000, tokens_per_s=users / step_s,
                       top_ops=top_ops(prof, steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--contexts", type=int, nargs="+", default=[100, 1000, 2000])
    parser.add_argument("--steps", type=int, default=10, help="steps timed, then as many profiled")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attention", default="auto", choices=["auto", "cpu-kernel", "torch"])
    parser.add_argument("--out", type=Path, default=Path("results/profile_decode.json"))
    args = parser.parse_args()

    device = pick_device(args.device)
    model = load_model(resolve_model_dir(args.model), device, pick_dtype(args.dtype))
    cells = []
    for users in args.users:
        for context in args.contexts:
            print(f"profiling {users} users x {context} tokens of context ...", flush=True)
            cells.append(profile_cell(model, users, context, args.steps, args.attention))
    run = ProfileRun(device=str(device), dtype=args.dtype, machine=Machine.this_one(),
                     command="python3 " + shlex.join(sys.argv), results=cells)
    print(f"\ndevice {device}, {args.dtype}, {torch.get_num_threads()} threads, "
          f"{cells[0].attention} attention; mean of {args.steps} steps\n")
    print("\n".join(profile_table(run)))
    print("\n" + "\n".join(top_ops_table(run)))
    run.save(args.out)
    print(f"\nsaved {args.out}")


if __name__ == "__main__":
    main()
