"""Decode attention for sequences that share their first blocks: our kernel against a
cascade form.

--seqs sequences, each --prefix shared tokens (the same blocks) then 30-100 of its own, one
query token each, in the default model's attention shape (9 query heads on 3 K/V heads,
head dim 64, 30 layers, fp32). Per decode step (every layer once), best of --repeats:

- kernel: model/kernels/csrc/paged_attention_cpu.cpp over each whole context (what the engine runs);
- cascade: the shared prefix once for all queries, a GEMM per K/V head (torch.bmm: the
  group's query heads of every sequence as rows), then each sequence's own tokens, the two
  merged by their log-sum-exp (all in PyTorch);
- the cascade's floor: the prefix GEMM part alone plus the kernel over the own tokens alone,
  without the merge, i.e. the least a compiled cascade could take with these two parts.

With --engine-step it also loads the default model and times the engine's decode steps
with --seqs users of the shared-prompt benchmark (benchmarks/bench.py --system-repeats 50)
all decoding, to set the kernel's share of a step against it.

    python3 benchmarks/studies/cascade_decode_microbench.py --prefix 512 656 --engine-step
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # see benchmarks/__init__.py

import torch
from torch import Tensor

from kvcache.pool import BLOCK_SIZE
from model.kernels.build import load_paged_decode_attention

torch.set_grad_enabled(False)
HEADS, KV_HEADS, DIM = 9, 3, 64


class Shape:
    """A pool per layer, the shared prefix in blocks 1.., then each sequence's own blocks."""

    def __init__(self, seqs: int, prefix: int, layers: int, seed: int = 0) -> None:
        assert prefix % BLOCK_SIZE == 0, "the shared prefix is whole blocks"
        gen = torch.Generator().manual_seed(seed)
        self.own = torch.randint(30, 101, (seqs,), generator=gen).tolist()
        self.prefix_blocks = list(range(1, 1 + prefix // BLOCK_SIZE))
        next_block, own_tables = 1 + len(self.prefix_blocks), []
        for n in self.own:
            count = -(-n // BLOCK_SIZE)
            own_tables.append(list(range(next_block, next_block + count)))
            next_block += count
        width = max(map(len, own_tables))
        pad = [t + [0] * (width - len(t)) for t in own_tables]
        self.own_tables = torch.tensor(pad, dtype=torch.int64)
        self.tables = torch.tensor([self.prefix_blocks + t for t in pad], dtype=torch.int64)
        self.own_lens = torch.tensor(self.own, dtype=torch.int64)
        self.lens = self.own_lens + prefix
        self.prefix_ids = torch.tensor(self.prefix_blocks, dtype=torch.int64)
        shape = (next_block, BLOCK_SIZE, KV_HEADS, DIM)
        self.k = [torch.randn(shape, generator=gen) for _ in range(layers)]
        self.v = [torch.randn(shape, generator=gen) for _ in range(layers)]
        self.q = torch.randn(seqs, HEADS, DIM, generator=gen)
        own_pos = torch.arange(width * BLOCK_SIZE)
        # [seqs, 1, 1, width * BLOCK_SIZE]: 0 on a sequence's own tokens, -inf past them
        self.own_mask = torch.where(own_pos[None] < self.own_lens[:, None], 0.0,
                                    float("-inf"))[:, None, None]
        self.scale = DIM ** -0.5


def prefix_part(s: Shape, layer: int, q: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every sequence's queries over the shared prefix, one bmm per K/V head: the output
    (unnormalized), the row maxima and the sums of exp, as [seqs, kv_heads, group, ...]."""
    seqs, group = q.shape[0], HEADS // KV_HEADS
    keys = s.k[layer].index_select(0, s.prefix_ids).flatten(0, 1)  # [prefix, kv_heads, dim]
    values = s.v[layer].index_select(0, s.prefix_ids).flatten(0, 1)
    rows = q.view(seqs, KV_HEADS, group, DIM).transpose(0, 1).reshape(KV_HEADS, -1, DIM)
    scores = torch.bmm(rows, keys.permute(1, 2, 0)).mul_(s.scale)  # [kv_heads, rows, prefix]
    peak = scores.amax(-1, keepdim=True)
    weights = scores.sub_(peak).exp_()
    total = weights.sum(-1, keepdim=True)
    out = torch.bmm(weights, values.transpose(0, 1))  # [kv_heads, rows, dim]

    def back(x: Tensor) -> Tensor:
        return x.view(KV_HEADS, seqs, group, -1).transpose(0, 1)

    return back(out), back(peak), back(total)


def own_part(s: Shape, layer: int, q: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sequence's query over its own tokens (gathered, padded, masked): as prefix_part."""
    seqs, group = q.shape[0], HEADS // KV_HEADS
    flat = s.own_tables.flatten()
    shape = (seqs, -1, KV_HEADS, DIM)
    keys = s.k[layer].index_select(0, flat).view(shape).permute(0, 2, 3, 1)  # [s, kvh, dim, t]
    values = s.v[layer].index_select(0, flat).view(shape).transpose(1, 2)  # [s, kvh, t, dim]
    rows = q.view(seqs, KV_HEADS, group, DIM)
    scores = torch.matmul(rows, keys).mul_(s.scale).add_(s.own_mask)  # [s, kvh, group, t]
    peak = scores.amax(-1, keepdim=True)
    weights = scores.sub_(peak).exp_()
    total = weights.sum(-1, keepdim=True)
    return torch.matmul(weights, values), peak, total


def cascade(s: Shape, layer: int, q: Tensor) -> Tensor:
    o1, m1, l1 = prefix_part(s, layer, q)
    o2, m2, l2 = own_part(s, layer, q)
    peak = torch.maximum(m1, m2)
    w1, w2 = (m1 - peak).exp_(), (m2 - peak).exp_()
    out = (o1 * w1 + o2 * w2) / (l1 * w1 + l2 * w2)
    return out.reshape(q.shape)


def step_ms(layers: int, attend: Callable[[int], object], repeats: int) -> float:
    """One decode step's attention (every layer once), best of `repeats`, in ms."""
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        for layer in range(layers):
            attend(layer)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def measure(seqs: int, prefix: int, layers: int, repeats: int) -> None:
    kernel = load_paged_decode_attention()
    assert kernel is not None, "the CPU kernels did not build here"
    s = Shape(seqs, prefix, layers)
    q = s.q

    def whole(layer: int) -> Tensor:
        return kernel(q, s.k[layer], s.v[layer], s.tables, s.lens, s.scale, 0)

    def own_only(layer: int) -> Tensor:
        return kernel(q, s.k[layer], s.v[layer], s.own_tables, s.own_lens, s.scale, 0)

    diff = max((cascade(s, la, q) - whole(la)).abs().max().item() for la in range(layers))
    kernel_ms = step_ms(layers, whole, repeats)
    cascade_ms = step_ms(layers, lambda la: cascade(s, la, q), repeats)
    prefix_ms = step_ms(layers, lambda la: prefix_part(s, la, q), repeats)
    own_ms = step_ms(layers, own_only, repeats)
    print(f"| {seqs} | {prefix} | {min(s.own)}-{max(s.own)} | {kernel_ms:.2f} | {cascade_ms:.2f} "
          f"| {prefix_ms:.2f} + {own_ms:.2f} = {prefix_ms + own_ms:.2f} | {diff:.1e} |")


def engine_decode_step_ms(seqs: int, steps: int) -> tuple[float, int]:
    """The engine's median decode step with `seqs` users of the shared-prompt benchmark all
    decoding, and their mean context then."""
    from benchmarks.bench import system_prompt, user_prompt
    from engine.config import EngineConfig
    from engine.load import load_engine
    from engine.request import Request, SamplingParams

    engine = load_engine(EngineConfig())
    core, prefix = engine.core, system_prompt(50)
    for u in range(seqs):
        prompt = engine.tokenizer(user_prompt(prefix, u, u)).input_ids
        core.add(Request(f"u{u}", prompt, SamplingParams(max_tokens=steps + 40, temperature=0,
                                                         ignore_eos=True), lambda _: None))
    running = core.scheduler.running
    while not (len(running) == seqs and all(r.num_output_tokens >= 1 for r in running)):
        core.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        core.step()
        times.append((time.perf_counter() - start) * 1e3)
    context = sum(r.num_tokens for r in running) // seqs
    return statistics.median(times), context


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, default=30)
    p.add_argument("--prefix", type=int, nargs="+", default=[512])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--engine-step", action="store_true",
                   help="also time the engine's decode step at the benchmark's context")
    args = p.parse_args()
    print(f"torch threads: {torch.get_num_threads()}; ms per decode step ({args.layers} layers)")
    print("| seqs | shared prefix | own tokens | kernel | cascade (PyTorch) "
          "| prefix GEMM + kernel over own tokens | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for prefix in args.prefix:
        measure(args.seqs, prefix, args.layers, args.repeats)
    if args.engine_step:
        ms, context = engine_decode_step_ms(args.seqs, 20)
        print(f"engine decode step, {args.seqs} users decoding, mean context {context}: "
              f"{ms:.1f} ms (median of 20)")


if __name__ == "__main__":
    main()
