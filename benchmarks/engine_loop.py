"""One user through the engine alone, no HTTP: the inter-token latency the engine itself
gives, to set beside the end-to-end figure of benchmarks/bench.py.

    python3 benchmarks/engine_loop.py --dtype bfloat16 --single-thread-below 0
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.batch_engine import load_engine
from engine.config import EngineConfig
from engine.request import Request, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights", default="default")
    parser.add_argument("--model", default=None, help="as server.py's (default: the default "
                        "model)")
    parser.add_argument("--lm-head", default="default", choices=["default", "q8_0"])
    parser.add_argument("--single-thread-below", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = load_engine(EngineConfig(model=args.model, dtype=args.dtype, weights=args.weights,
                                      lm_head=args.lm_head,
                                      single_thread_below=args.single_thread_below))
    prompt = engine.tokenizer("Once upon a time").input_ids
    for round_ in range(args.rounds):
        times: list[float] = []
        params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
        engine.add_request(Request(f"r{round_}", prompt, params,
                                   lambda _, times=times: times.append(time.perf_counter())))
        while len(times) < args.tokens:
            engine.step()
        gaps = sorted(b - a for a, b in pairwise(times))
        print(f"{args.model or 'default model'}, {args.dtype}, {args.weights} weights, "
              f"{args.lm_head} LM head, single thread below "
              f"{args.single_thread_below}: ITL p50 {gaps[len(gaps) // 2] * 1000:.2f} ms")


if __name__ == "__main__":
    main()
