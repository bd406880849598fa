"""KV cache held by one request at a long context on a sliding-window model (Gemma 3), with
the hybrid KV cache (sliding groups give back the blocks their window has left behind) and
without it (every token's K/V kept for every layer).

    python3 benchmarks/sliding_window_kv.py --model gemma-3-270m --context 4096

Each mode runs one greedy request through the engine (chunked prefill at the default token
budget) and reads the allocator and the request's block tables after the step that
computes its prompt's last token: the blocks it holds, times the layers a block holds,
are its layer-blocks (16 tokens of one layer's K and V); the peak is the most the pool had
in use once a step's blocks were taken (before it ran and gave any back). Both modes must
sample the same tokens.
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemma3_gguf_check import long_prompt
from engine.config import EngineConfig
from engine.load import load_engine
from engine.request import Request, SamplingParams
from kvcache.pool import BLOCK_SIZE, KVCachePool


@dataclass
class Held:
    mode: str
    groups: str
    blocks: int  # pool blocks the request holds, all groups
    layers_per_block: int
    peak_blocks: int  # the most blocks in use after any step
    layer_block_bytes: int
    tokens: list[int]

    @property
    def layer_blocks(self) -> int:
        return self.blocks * self.layers_per_block

    @property
    def peak_layer_blocks(self) -> int:
        return self.peak_blocks * self.layers_per_block


def measure(model: str, hybrid: bool, context: int, new_tokens: int, memory: str) -> Held:
    engine = load_engine(EngineConfig(model=model, hybrid_kv_cache=hybrid,
                                      kv_cache_memory=memory, enable_prefix_cache=False))
    core = engine.core
    prompt = long_prompt(engine.tokenizer, context)
    request = Request("long", prompt, SamplingParams(max_tokens=new_tokens, temperature=0,
                                                     ignore_eos=True), lambda _: None)
    engine.add_request(request)
    held, peak = None, 0
    schedule, allocator = core.scheduler.schedule, core.allocator

    def scheduled_then_counted():  # the peak: blocks taken for a step, before it runs
        nonlocal peak
        out = schedule()
        peak = max(peak, allocator.num_used)
        return out

    core.scheduler.schedule = scheduled_then_counted
    while engine.has_work():
        engine.step()
        if held is None and request.num_computed_tokens >= context:
            held = len(request.blocks.held())
            assert held == core.allocator.num_used  # the only request: all it holds
    assert held is not None and core.allocator.num_used == 0
    cfg = core.runner.model.cfg
    layer_block_bytes = KVCachePool.bytes_per_block(1, cfg.num_kv_heads, cfg.head_dim,
                                                    core.pool.k[0].dtype)
    result = Held("hybrid" if hybrid else "full in every layer", core.groups.describe(), held,
                  core.groups.group_size, peak, layer_block_bytes,
                  request.token_ids[len(prompt):])
    del engine, core
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--context", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--kv-cache-memory", default="512MiB")
    args = parser.parse_args()
    print(f"python3 benchmarks/sliding_window_kv.py --model {args.model} "
          f"--context {args.context} --new-tokens {args.new_tokens} "
          f"--kv-cache-memory {args.kv_cache_memory}")
    runs = [measure(args.model, hybrid, args.context, args.new_tokens, args.kv_cache_memory)
            for hybrid in (True, False)]
    mib = 2**20
    for r in runs:
        print(f"{r.mode} ({r.groups}): at {args.context} tokens computed the request holds "
              f"{r.blocks} blocks of {r.layers_per_block} layers = {r.layer_blocks} "
              f"layer-blocks of {BLOCK_SIZE} tokens "
              f"({r.layer_blocks * r.layer_block_bytes / mib:.1f} MiB); peak during the run "
              f"{r.peak_layer_blocks} layer-blocks "
              f"({r.peak_layer_blocks * r.layer_block_bytes / mib:.1f} MiB)")
    hybrid, full = runs
    print(f"hybrid / full: {hybrid.layer_blocks / full.layer_blocks:.3f} of the layer-blocks "
          f"held at {args.context} tokens, {hybrid.peak_layer_blocks / full.peak_layer_blocks:.3f}"
          f" of the peak")
    print(f"greedy tokens: hybrid {hybrid.tokens}, full {full.tokens}")
    assert hybrid.tokens == full.tokens, "the two modes sampled different tokens"


if __name__ == "__main__":
    main()
