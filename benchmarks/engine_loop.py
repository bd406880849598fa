"""One user through the engine alone, no HTTP: the inter-token latency the engine itself
gives, to set beside the end-to-end figure of benchmarks/bench.py. With --users N, N equal
requests decode together and the figure is the first one's ITL: one batched step.

    python3 benchmarks/engine_loop.py --dtype bfloat16 --single-thread-below 0

With --compare-decode-stack it loads the engine twice, with decode steps in one C++ call for
every layer (the default) and layer by layer from Python (--no-decode-stack), and runs the
rounds in turns, so the two are measured side by side.

With --compare-row-streams the same engine runs its rounds in turns with the dense kernel
reading one row's weight panels side by side (the default: four with AVX-512, two or three
with AVX2) and one after another
(set_dense_row_streams), the same sums either way.

With --as-served the engine takes the thread and prefetch choices the server's engine core
takes at start (engine/thread_choice.py: this machine's cached measurement, made now if there
is none), instead of --single-thread-below and the kernel's default prefetch distance; what
benchmarks/served_overhead.py compares with the server.
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import pairwise, product
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig
from engine.load import load_engine
from engine.request import Request, SamplingParams
from engine.thread_choice import choose_threads
from model.dense_linear import load_dense_linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights", default="default")
    parser.add_argument("--model", default=None, help="as server.py's (default: the default "
                        "model)")
    parser.add_argument("--lm-head", default="default", choices=["default", "q8_0"])
    parser.add_argument("--single-thread-below", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--users", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--activations", default="float32")
    parser.add_argument("--compare-decode-stack", action="store_true",
                        help="also the layer-by-layer path, in turns with the default")
    parser.add_argument("--compare-row-streams", action="store_true",
                        help="also one row's panels one after another, in turns with the "
                        "default (side by side)")
    parser.add_argument("--as-served", action="store_true",
                        help="the server's cached thread and prefetch choices")
    args = parser.parse_args()
    stacks = [True, False] if args.compare_decode_stack else [True]
    engines = {stack: load_engine(EngineConfig(
        model=args.model, dtype=args.dtype, weights=args.weights, activations=args.activations,
        lm_head=args.lm_head, single_thread_below=args.single_thread_below, decode_stack=stack))
        for stack in stacks}
    if args.as_served:
        for engine in engines.values():
            chosen = choose_threads(engine.core)
            args.single_thread_below = args.single_thread_below if chosen is None else chosen
    streams = [True, False] if args.compare_row_streams else [True]
    kernels = load_dense_linear() if args.compare_row_streams else None
    if args.compare_row_streams and kernels is None:
        parser.error("--compare-row-streams: the dense kernel does not run here")
    for round_ in range(args.rounds):
        for (stack, engine), side_by_side in product(engines.items(), streams):
            if kernels is not None:
                kernels.tuning.set_dense_row_streams(side_by_side)
            p50 = itl_p50(engine, f"r{round_}", args.tokens, args.users)
            print(f"{args.model or 'default model'}, {args.dtype}, {args.weights} weights, "
                  f"{args.activations} activations, {args.lm_head} LM head, "
                  f"single thread below {args.single_thread_below}, {args.users} user(s), decode "
                  f"{'stack' if stack else 'layer by layer'}"
                  + ("" if side_by_side else ", one row's panels one after another")
                  + f": ITL p50 {p50:.2f} ms")
    if kernels is not None:
        kernels.tuning.set_dense_row_streams(True)


def itl_p50(engine, request_id: str, tokens: int, users: int = 1) -> float:
    """The median gap between the first of `users` equal greedy requests' tokens, in ms."""
    prompt = engine.tokenizer("Once upon a time").input_ids
    times: list[float] = []
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    engine.add_request(Request(request_id, prompt, params,
                               lambda _, times=times: times.append(time.perf_counter())))
    for i in range(1, users):
        engine.add_request(Request(f"{request_id}-{i}", prompt, params, lambda _: None))
    while len(times) < tokens:
        engine.step()
    while engine.has_work():
        engine.step()
    gaps = sorted(b - a for a, b in pairwise(times))
    return gaps[len(gaps) // 2] * 1000


if __name__ == "__main__":
    main()
