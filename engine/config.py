"""The one config object the CLI fills, for the engine (the server adds host and port)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from engine.spec_decode import SpeculativeConfig


@dataclass
class EngineConfig:
    model: str | None = None  # a local Hugging Face folder; None = the default model
    device: str | None = None  # None = CUDA, else MPS, else CPU
    dtype: str = "float32"
    max_num_seqs: int = 30  # seats: sequences decoded together
    num_blocks: int | None = None  # KV pool size in blocks; None = from kv_cache_memory
    kv_cache_memory: str = "auto"  # a size, a share of the free memory, or auto
    enable_prefix_cache: bool = True
    # Sliding-window models: a block table per KV cache group, and the blocks a window has
    # left behind given back (kvcache/groups.py); False keeps every token for every layer.
    hybrid_kv_cache: bool = True
    max_num_batched_tokens: int = 512  # token budget of one step (prefill chunks + decodes)
    max_prefills_per_step: int = 0  # newcomers seated per step; 0 = as many as fit
    attention: str = "auto"  # decode attention: "cpu-kernel", "torch" (gather + SDPA) or auto
    matmul: str = "auto"  # linear layers: "auto" (our packed CPU kernel where it runs), "torch"
    fused_ops: bool = True  # the compiled small ops between the matmuls, where they build
    decode_stack: bool = True  # decode steps' layers in one C++ call, where the model allows
    threads: int | None = None  # most threads a step uses; None = PyTorch's default (cores)
    single_thread_below: int = 16  # steps computing fewer tokens run on one thread; 0 = never
    # A step uses only the cores other processes leave free (engine/cpu_load.py); False: all.
    yield_cores: bool = True
    # The engine core process: "cached" (measure unless this machine's choice is cached),
    # "again" (measure anew), "no" (use single_thread_below); engine/thread_choice.py.
    measure_threads: str = "no"
    # "default" (a GGUF file's own codes, a folder's weights in --dtype), "gguf" ("q4_1"),
    # "dense" or "int8": model/loader.py resolve_weights
    weights: str = "default"
    activations: str = "float32"  # q4_1's layers: "float32" (exact) or "int8" (faster)
    lm_head: str = "default"  # "q8_0": the default weights' LM head on the Q8_0 kernel (CPU)
    max_waiting: int = 256  # beyond this, new requests are refused with 429
    request_timeout: float | None = None  # seconds from arrival; None = no limit
    max_num_queued_tokens: int | None = None  # prompt tokens waiting beyond this: 429
    scheduling_policy: str = "fcfs"  # "fcfs" or "priority" (lower `priority` first)
    priority_aging: float = 10.0  # priority: seconds of waiting worth one level; 0 = none
    grammar_compile_timeout: float = 5.0  # structured outputs: seconds to compile a grammar
    accept_unknown_fields: bool = False  # request fields no API defines: ignored, not a 400
    burst_wait_ms: float = 50.0  # after an idle spell, the longest wait for a burst's rest
    speculative: SpeculativeConfig | None = None  # n-gram speculative decoding; None = off
    chat_template: str | None = None  # a Jinja file replacing the model's chat template

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        d = EngineConfig()
        parser.add_argument("--model", default=None, action="append",
                            help="a local Hugging Face folder, a GGUF file, or gemma-3-270m "
                                 "(fetched on first use); default: SmolLM2-135M-Instruct, "
                                 "prepared on first use. server.py takes it several times, "
                                 "each optionally NAME=PATH, to serve several models")
        parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best)")
        parser.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16", "float16"])
        parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
        parser.add_argument("--num-blocks", type=int, default=None,
                            help="KV cache blocks of 16 tokens (overrides --kv-cache-memory)")
        parser.add_argument("--kv-cache-memory", default=d.kv_cache_memory,
                            help="KV cache size: e.g. 2GiB or 512MiB, a share of the memory "
                                 "free once the weights are loaded (e.g. 50%%), or auto "
                                 "(40%% of it, at most 2GiB); the startup line says how many "
                                 "tokens it holds")
        parser.add_argument("--no-prefix-cache", action="store_true",
                            help="turn prefix caching off (also NANO_PREFIX_CACHE=0)")
        parser.add_argument("--disable-hybrid-kv-cache", action="store_true",
                            help="sliding-window models (Gemma 3): keep every token's K/V for "
                                 "every layer instead of giving back the blocks a window has "
                                 "left behind (for comparison)")
        parser.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                            help="tokens computed per step; longer prompts are prefilled in chunks")
        parser.add_argument("--max-prefills-per-step", type=int, default=0,
                            help="seat at most this many new requests per step (0 = no limit; "
                                 "1 = one-at-a-time prefill, for comparison)")
        parser.add_argument("--attention", default=d.attention,
                            choices=["auto", "cpu-kernel", "torch"],
                            help="decode attention: compiled CPU kernel reading blocks in place "
                                 "(fp32 or bf16), or PyTorch gather + SDPA (auto: the kernel "
                                 "on CPU in fp32 or bf16)")
        parser.add_argument("--matmul", default=d.matmul, choices=["auto", "torch"],
                            help="linear layers: our kernel over weights packed once at load "
                                 "(auto: where the CPU has AVX-512, or AVX2 with FMA), or "
                                 "PyTorch's matmul")
        parser.add_argument("--no-decode-stack", action="store_true",
                            help="run decode steps layer by layer from Python instead of in "
                                 "one C++ call for all layers (same logits; for comparison "
                                 "and debugging)")
        parser.add_argument("--threads", type=int, default=None,
                            help="most threads one step uses (default: PyTorch's, the cores)")
        parser.add_argument("--single-thread-below", type=threshold_arg, default=None,
                            metavar="N|measure",
                            help="steps computing fewer tokens than this run on one thread "
                                 "(0: always all threads). Default in the engine core process: "
                                 "measured at the first start on this machine (decode steps "
                                 "at batch 1-16 on one thread and on all), then read from a "
                                 "cache; 'measure' measures again. With --no-engine-process, "
                                 f"where the step shares the process with the HTTP server: "
                                 f"{d.single_thread_below}")
        parser.add_argument("--no-yield-cores", action="store_true",
                            help="keep every thread while other processes hold cores (default: "
                                 "a step uses only the cores they leave free, read from /proc "
                                 "every 0.25 s: OpenMP threads sharing a busy core wait for "
                                 "each other)")
        parser.add_argument("--weights", default=d.weights,
                            choices=["default", "gguf", "dense", "q4_1", "int8"],
                            help="gguf: a GGUF file's own codes (every F16, BF16, Q4_0-Q8_0 "
                                 "and K-quant matrix on its own kernel, exact to the fp32 "
                                 "model; the default for --model FILE.gguf), or for the "
                                 "default model its Q4_1 GGUF's (q4_1 is the older name); "
                                 "dense: the weights as --dtype arrays (a GGUF file "
                                 "dequantized: about 4 bytes a weight; a folder's default); "
                                 "int8: per-channel int8 made at load. gguf and int8: CPU, "
                                 "float32 activations, AVX-512 or AVX2")
        parser.add_argument("--activations", default=d.activations, choices=["float32", "int8"],
                            help="with GGUF codes: int8 rounds each Q4_1 or Q8_0 layer's "
                                 "input to 8 bits per block of 32 for integer dot products "
                                 "(AVX512-VNNI or AVX2; faster with many sequences, not exact: "
                                 "docs/quantized.md); float32 (default) is exact")
        parser.add_argument("--lm-head", default=d.lm_head, choices=["default", "q8_0"],
                            help="q8_0: the LM head on the Q8_0 kernel (CPU, float32): a GGUF "
                                 "file's own Q8_0 head or tied embedding codes (exact up to "
                                 "summation order), else Q8_0 codes made at load (not exact; "
                                 "docs/models.md)")
        parser.add_argument("--max-waiting", type=int, default=d.max_waiting,
                            help="queued requests beyond this get HTTP 429")
        parser.add_argument("--request-timeout", type=float, default=None,
                            help="abort a request this many seconds after it arrived")
        parser.add_argument("--max-num-queued-tokens", type=int, default=None,
                            help="prompt tokens waiting for a seat beyond this get HTTP 429 "
                                 "(default: no cap; --max-waiting still applies)")
        parser.add_argument("--scheduling-policy", default=d.scheduling_policy,
                            choices=["fcfs", "priority"],
                            help="order of the waiting line: first come first served, or by "
                                 "the request's 'priority' (lower first), then arrival")
        parser.add_argument("--priority-aging", type=float, default=d.priority_aging,
                            help="with --scheduling-policy priority: seconds of waiting worth "
                                 "one priority level, so nothing starves (0: strict priority)")
        parser.add_argument("--grammar-compile-timeout", type=float,
                            default=d.grammar_compile_timeout,
                            help="a structured output's grammar that takes longer to compile "
                                 "gets HTTP 400")
        parser.add_argument("--accept-unknown-fields", action="store_true",
                            help="accept request fields that no API defines and ignore them "
                                 "(each name logged once), as vLLM does; by default such a "
                                 "field is a 400 naming it, as OpenAI's and Anthropic's APIs "
                                 "answer")
        parser.add_argument("--burst-wait-ms", type=float, default=d.burst_wait_ms,
                            help="after an idle spell, the first step waits up to this long "
                                 "for the requests the HTTP process says are on their way "
                                 "(users who sent theirs at the same moment), so they start "
                                 "together; 0: start at once")
        parser.add_argument("--speculative-config", default=None,
                            help="speculative decoding by n-gram prompt lookup, as JSON with "
                                 "vLLM's keys, e.g. '{\"method\": \"ngram\", "
                                 "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, "
                                 "\"prompt_lookup_min\": 2}' (also disable_by_batch_size: "
                                 "no drafts while more requests are seated; default 4)")
        parser.add_argument("--chat-template", default=None, metavar="FILE",
                            help="a Jinja chat template file, used instead of the model "
                                 "folder's (needed for /v1/chat/completions when the folder "
                                 "has none)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """The config the CLI's flags describe."""
        prefix_cache = not args.no_prefix_cache and os.environ.get("NANO_PREFIX_CACHE", "1") != "0"
        model = args.model
        if isinstance(model, list):  # --model given several times: server.py splits them
            if len(model) > 1:
                raise ValueError("--model is given several times; only server.py serves "
                                 "several models")
            model = model[0]
        config = cls(model=model, device=args.device, dtype=args.dtype,
                     max_num_seqs=args.max_num_seqs, num_blocks=args.num_blocks,
                     kv_cache_memory=args.kv_cache_memory, enable_prefix_cache=prefix_cache,
                     hybrid_kv_cache=not args.disable_hybrid_kv_cache,
                     max_num_batched_tokens=args.max_num_batched_tokens,
                     max_prefills_per_step=args.max_prefills_per_step,
                     attention=args.attention, matmul=args.matmul, weights=args.weights,
                     decode_stack=not args.no_decode_stack,
                     activations=args.activations, lm_head=args.lm_head,
                     threads=args.threads, single_thread_below=single_thread_below(args),
                     measure_threads=measure_threads(args),
                     yield_cores=not args.no_yield_cores,
                     max_waiting=args.max_waiting,
                     request_timeout=args.request_timeout,
                     max_num_queued_tokens=args.max_num_queued_tokens,
                     scheduling_policy=args.scheduling_policy,
                     priority_aging=args.priority_aging,
                     grammar_compile_timeout=args.grammar_compile_timeout,
                     accept_unknown_fields=args.accept_unknown_fields,
                     burst_wait_ms=args.burst_wait_ms,
                     speculative=(None if args.speculative_config is None
                                  else SpeculativeConfig.from_json(args.speculative_config)),
                     chat_template=args.chat_template)
        config.validate()
        return config

    def validate(self) -> None:
        """ValueError naming the flag for the first setting that cannot work."""
        if self.max_num_seqs < 1:
            raise ValueError("--max-num-seqs must be at least 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("--max-num-batched-tokens must be at least --max-num-seqs, so every "
                             "seated sequence can decode in each step")
        self._validate_weights()
        self._validate_line()

    def _validate_weights(self) -> None:
        """The weight formats' and precisions' combinations."""
        if self.weights not in ("default", "dense") and (self.dtype != "float32"
                                          or self.device not in (None, "cpu")):
            raise ValueError(f"--weights {self.weights} runs on the CPU with float32 "
                             "activations: drop --dtype / --device")
        if self.lm_head != "default" and (self.weights not in ("default", "dense")
                                          or self.dtype != "float32"
                                          or self.device not in (None, "cpu")):
            raise ValueError(f"--lm-head {self.lm_head} runs the default weights' LM head on "
                             "the CPU in float32: drop --weights / --dtype / --device")
        if self.activations not in ("float32", "int8"):
            raise ValueError("--activations must be float32 or int8")
        if self.activations == "int8" and self.weights not in ("default", "gguf", "q4_1"):
            raise ValueError("--activations int8 needs GGUF codes (--weights gguf, the "
                             "default for a GGUF file): it multiplies Q4_1 and Q8_0 codes by "
                             "int8 activations")

    def _validate_line(self) -> None:
        """The waiting line's and the requests' limits."""
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError("--request-timeout must be a positive number of seconds")
        if self.max_waiting < 1:
            raise ValueError("--max-waiting must be at least 1")
        if self.max_num_queued_tokens is not None and self.max_num_queued_tokens < 1:
            raise ValueError("--max-num-queued-tokens must be at least 1")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("--scheduling-policy must be fcfs or priority")
        if not self.priority_aging >= 0:  # also refuses NaN
            raise ValueError("--priority-aging must be 0 or more seconds")
        if not self.grammar_compile_timeout > 0:
            raise ValueError("--grammar-compile-timeout must be above 0")
        if not self.burst_wait_ms >= 0:
            raise ValueError("--burst-wait-ms must be 0 or more")


def threshold_arg(text: str) -> int | str:
    """--single-thread-below's value: a count of tokens, or "measure"."""
    if text == "measure":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'measure', "
                                         f"got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more tokens")
    return value


def measure_threads(args: argparse.Namespace) -> str:
    """Whether the engine core process measures --single-thread-below (see EngineConfig).
    Never in-process: there the step shares the GIL with the HTTP server, and a measurement
    taken at start, with no HTTP load, would pick threads that lose under it."""
    value = args.single_thread_below
    in_process = not getattr(args, "engine_process", False)
    if value == "measure":
        if in_process:
            raise ValueError("--single-thread-below measure needs the engine core process: "
                             "in-process the step shares the GIL with the HTTP server, so a "
                             "measurement at start misleads; give a number")
        return "again"
    return "cached" if value is None and not in_process else "no"


def single_thread_below(args: argparse.Namespace) -> int:
    """--single-thread-below, or its default: one thread for small steps in-process, where two
    OpenMP threads lose to the HTTP loop and the GIL on a small machine (measured:
    docs/results.md, "The engine core in its own process"); in an engine process of its own,
    all threads until engine/thread_choice.py measures (or reads) this machine's value."""
    if isinstance(args.single_thread_below, int):
        return args.single_thread_below
    return 0 if getattr(args, "engine_process", False) else EngineConfig.single_thread_below

