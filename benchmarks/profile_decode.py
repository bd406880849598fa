"""Where one decode step's time goes, by part of the forward pass.

    python3 profile_decode.py --users 1 10 30 --contexts 100 1000 2000

For each (users, context) it fills a paged KV pool as if every user already had
`context` tokens, then runs decode steps by hand through the real modules
(model/llama.py, model/paged_attention.py, engine/sampler.py), timing each part
and waiting for the device before every reading. The hand-run step is checked
against ModelRunner.run on the same input, whose own time is printed too, so the
parts add up to something real.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from engine.model_runner import ModelRunner, SequenceStep
from engine.request import SamplingParams
from engine.sampler import sample
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks
from kvcache.pool import KVCachePool
from model.llama import LlamaModel, RotaryEmbedding
from model.loader import load_model, pick_device, pick_dtype
from model.paged_attention import PagedAttention, StepMetadata
from model.prepare import resolve_model_dir

PARTS = ["step setup", "embedding", "norms", "qkv", "rope", "kv write", "gather", "attention",
         "o_proj", "mlp", "lm head", "sampling"]


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.totals: dict[str, float] = defaultdict(float)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elif self.device.type == "mps":
            torch.mps.synchronize()

    @contextmanager
    def part(self, name: str):
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        self.totals[name] += time.perf_counter() - start


def decode_by_hand(model: LlamaModel, pool: KVCachePool, tables: list[list[int]],
                   context_len: int, token_ids: list[int], clock: Clock,
                   kernel: Callable | None) -> torch.Tensor:
    """One decode step, part by part; same operations as LlamaModel.forward + PagedAttention."""
    device = clock.device
    users = len(tables)
    with clock.part("step setup"):
        step = StepMetadata.build([(t, context_len) for t in tables], [], device,
                                  model.embed_tokens.weight.dtype)
        ids = torch.tensor(token_ids, device=device)
        positions = torch.full((users,), context_len - 1, device=device)
    with clock.part("embedding"):
        x = model.embed_tokens(ids)
    with clock.part("rope"):
        rope = model.rotary.table(positions)
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        with clock.part("norms"):
            h = layer.input_layernorm(x)
        with clock.part("qkv"):
            qkv = attn.qkv_proj(h)
        with clock.part("rope"):
            kv_size = attn.num_kv_heads * attn.head_dim
            qk, v = qkv.split([attn.num_heads * attn.head_dim + kv_size, kv_size], dim=-1)
            qk = RotaryEmbedding.apply(qk.unflatten(-1, (-1, attn.head_dim)), *rope)
            q, k = qk.split([attn.num_heads, attn.num_kv_heads], dim=-2)
            v = v.unflatten(-1, (attn.num_kv_heads, attn.head_dim))
        k_cache, v_cache = pool.k[i], pool.v[i]
        with clock.part("kv write"):
            PagedAttention.write(k_cache, v_cache, k, v, step)
        if kernel is not None:  # reads K/V in place: there is no gather
            with clock.part("attention"):
                out = kernel(q.contiguous(), k_cache, v_cache, step.single_block_tables,
                             step.single_context_lens, attn.head_dim ** -0.5)
        else:
            with clock.part("gather"):
                keys, values = PagedAttention.gather_single(k_cache, v_cache, step)
            with clock.part("attention"):
                out = PagedAttention.attend_single(q, keys, values, step)
        with clock.part("o_proj"):
            x = x + attn.o_proj(out.flatten(-2))
        with clock.part("norms"):
            h = layer.post_attention_layernorm(x)
        with clock.part("mlp"):
            x = x + layer.mlp(h)
    with clock.part("lm head"):
        logits = model.lm_head(model.norm(x))
    with clock.part("sampling"):
        sample(logits, [SamplingParams(temperature=0)] * users, [None] * users)
    return logits


@torch.inference_mode()
def profile(model: LlamaModel, users: int, context: int, steps: int, backend: str) -> dict:
    cfg, device = model.cfg, model.embed_tokens.weight.device
    dtype = model.embed_tokens.weight.dtype
    per_user = context + steps + 2
    num_blocks = 1 + users * -(-per_user // 16)
    pool = KVCachePool(cfg.num_layers, num_blocks, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    for t in pool.k + pool.v:  # as if every user had `context` tokens computed already
        t.normal_()
    kv = KVCacheManager(BlockAllocator(num_blocks, enable_prefix_cache=False))
    tables = []
    for _ in range(users):
        blocks = SequenceBlocks()
        kv.grow(blocks, per_user)
        tables.append(blocks.block_table)
    runner = ModelRunner(model, pool, backend)
    kernel = runner.attention.decode_kernel
    clock = Clock(device)
    token_ids = [(17 * u + 5) % cfg.vocab_size for u in range(users)]

    decode_by_hand(model, pool, tables, context + 1, token_ids, Clock(device), kernel)  # warm-up
    for s in range(steps):
        decode_by_hand(model, pool, tables, context + 1 + s, token_ids, clock, kernel)
    by_hand = decode_by_hand(model, pool, tables, context + steps, token_ids, Clock(device),
                             kernel)
    batch = [SequenceStep([t], context + steps - 1, table, True)
             for t, table in zip(token_ids, tables)]
    real = runner.run(batch)
    diff = (by_hand.float() - real.float()).abs().max().item()
    assert diff < 1e-3, f"hand-run step differs from ModelRunner.run by {diff}"

    clock.sync()
    start = time.perf_counter()
    for _ in range(steps):
        runner.run(batch)
    clock.sync()
    real_ms = (time.perf_counter() - start) / steps * 1000
    parts_ms = {p: clock.totals[p] / steps * 1000 for p in PARTS}
    return {"users": users, "context": context, "attention": runner.attention_backend,
            "parts_ms": parts_ms,
            "sum_of_parts_ms": sum(parts_ms.values()), "model_runner_ms": real_ms,
            "tokens_per_s": users / (real_ms / 1000)}


def print_table(results: list[dict]) -> None:
    heads = [f"{r['users']}u x {r['context']}" for r in results]
    print(f"{'ms per decode step':<20}" + "".join(f"{h:>13}" for h in heads))
    for part in PARTS:
        row = "".join(f"{r['parts_ms'][part]:>13.2f}" for r in results)
        print(f"{part:<20}{row}")
    print(f"{'sum of parts':<20}" + "".join(f"{r['sum_of_parts_ms']:>13.2f}" for r in results))
    print(f"{'ModelRunner.run':<20}" + "".join(f"{r['model_runner_ms']:>13.2f}" for r in results)
          + "   (model forward + setup, no sampling)")
    print(f"{'tokens/s (runner)':<20}" + "".join(f"{r['tokens_per_s']:>13.0f}" for r in results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--contexts", type=int, nargs="+", default=[100, 1000, 2000])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attention", default="auto", choices=["auto", "cpu-kernel", "torch"])
    parser.add_argument("--out", default="results/profile_decode.json")
    args = parser.parse_args()

    device = pick_device(args.device)
    model = load_model(resolve_model_dir(args.model), device, pick_dtype(args.dtype))
    torch.set_grad_enabled(False)
    results = []
    for users in args.users:
        for context in args.contexts:
            print(f"profiling {users} users x {context} tokens of context ...", flush=True)
            results.append(profile(model, users, context, args.steps, args.attention))
    print(f"\ndevice {device}, {args.dtype}, {torch.get_num_threads()} threads, "
          f"{results[0]['attention']} attention; mean of {args.steps} steps")
    print_table(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": str(device), "dtype": args.dtype,
                                          "results": results}, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
