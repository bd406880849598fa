"""The baseline server: nano-vLLM's API and model, over a naive per-user KV cache.

`python3 baseline_server.py` serves the same OpenAI-compatible API as server.py (on
127.0.0.1:8080 unless told otherwise). It is the fixed yardstick that the real engine is
measured against, so it is kept simple and is not optimised. It takes server.py's flags but
refuses, at start-up, each one it would not honour (REFUSED and FIXED below say why); the
rest it honours, --threads included (one thread count for every step).

It differs from the engine (engine/batch_engine.py) in three things only:

- **Model math.** The plain PyTorch forward pass (model/llama.py with PyTorch's matmuls and
  ops): our CPU kernels are optimisations, and a yardstick must not move when they improve.
  The matmuls and the small ops are PyTorch's, over the folder's weights in --dtype, and
  greedy sampling's argmax is NumPy's (Sampler(compiled=False)).
- **KV cache.** Each request keeps, per layer, its own K and V tensors
  [tokens, kv_heads, head_dim]. At every decode step each user's past is concatenated with
  its new K/V (torch.cat: a new allocation and a copy of the whole past), the users are
  right-padded to the longest and stacked into one batch, and attention masks the padding.
  That is the common naive design; the paged cache writes each K/V once and never moves it.
- **Prefill.** Each newcomer's prompt goes through the model alone, in one plain causal
  forward pass: no chunking, no token budget, no prefix cache. There is no preemption
  either: memory is not bounded. The line is first come first served (so a request's
  priority is refused).

A round seats waiting requests up to --max-num-seqs, prefills the newcomers one at a time,
then decodes one token for every seated request in one batched forward pass. Everything
else is the engine's own code: BatchEngine drives a BaselineEngineCore through the same
`EngineCore` protocol as the paged core (engine/core.py), so the request queue, aborts and
timeouts, sampling, stop conditions, detokenization, metrics and the HTTP app are shared.
The process layout is shared too: by default the core runs in an engine core process of
its own behind the same front end (engine/process/client.py), `--no-engine-process` keeps it
on a thread of the server's process, so a comparison with server.py isolates the core.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from engine.config import EngineConfig
from engine.core import EngineStats, StepResult
from engine.logprobs import TokenLogprobs, gather_logprobs, raw_logprobs
from engine.model_runner import ThreadPolicy
from engine.request import FinishReason, Request, Status
from engine.sampler import Sampler
from engine.step_types import RequestUpdate
from model.llama import LlamaModel, causal_attention
from server import build_parser, given_flags, run_server

log = logging.getLogger("nano_vllm.baseline")

UNBOUNDED = "the baseline has no block pool: each user's KV cache grows as it needs"
FCFS = "the baseline's line is first come first served"
# server.py's flags that the baseline does not honour (by dest): refused whenever given.
REFUSED = {
    "num_blocks": UNBOUNDED,
    "kv_cache_memory": UNBOUNDED,
    "no_prefix_cache": "the baseline has no prefix cache to turn off",
    "max_num_batched_tokens": "the baseline prefills each prompt whole, with no token budget",
    "max_prefills_per_step": "the baseline prefills every newcomer it seats, one by one, "
                             "before each decode step",
    "attention": "the baseline's decode attention is always its padded PyTorch SDPA",
    "single_thread_below": "the baseline runs every step on the same threads (--threads)",
    "speculative_config": "the baseline decodes one token per step, with no speculation",
    "priority_aging": FCFS,
}
# Flags it takes only at the one value it runs with: (that value, why).
FIXED = {
    "matmul": ("torch", "the baseline keeps PyTorch's matmuls"),
    "weights": ("default", "the baseline runs the folder's weights in --dtype"),
    "activations": ("float32", "the baseline runs the folder's weights in --dtype"),
    "lm_head": ("default", "the baseline runs the folder's weights in --dtype"),
    "scheduling_policy": ("fcfs", FCFS),
}


@dataclass
class UserKV:
    """One request's own KV cache: per layer, the K and V of every token computed so far,
    each [tokens, kv_heads, head_dim]."""

    k: list[Tensor]
    v: list[Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[0] if self.k else 0


class PrefillAttention:
    """The `attention` callable for one user's prefill: causal attention of the prompt over
    itself, keeping each layer's K/V as that user's cache. Flat layout: q [L, heads, dim],
    k and v [L, kv_heads, dim]."""

    def __init__(self) -> None:
        self.cache = UserKV([], [])

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        assert layer_idx == len(self.cache.k), "layers must run in order"
        # k and v are views into the layer's QKV output; copy them so the cache holds only K/V.
        self.cache.k.append(k.clone())
        self.cache.v.append(v.clone())
        return causal_attention(layer_idx, q[None], k[None], v[None])[0]


class PaddedDecodeAttention:
    """The `attention` callable for one decode step over per-user caches.

    q is [B, 1, heads, dim], k and v [B, 1, kv_heads, dim], row i belonging to caches[i].
    Per layer, each user's past is concatenated with its new K/V (that concatenation is the
    user's next cache), the users are right-padded to one length and stacked, and the
    padding is masked. The new caches are kept aside and only installed by `commit`, after
    the whole forward pass succeeded, so a failed step leaves every cache as it was.
    """

    def __init__(self, caches: list[UserKV], device: torch.device) -> None:
        self.caches = caches
        lengths = torch.tensor([c.length + 1 for c in caches], device=device)  # past + new
        key_pos = torch.arange(int(lengths.max()), device=device)
        self.mask = (key_pos[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, T]
        self.new_k: list[list[Tensor]] = []  # per layer, per user: past + this step's K
        self.new_v: list[list[Tensor]] = []

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        assert layer_idx == len(self.new_k), "layers must run in order"
        keys = [torch.cat([c.k[layer_idx], k[i]]) for i, c in enumerate(self.caches)]
        values = [torch.cat([c.v[layer_idx], v[i]]) for i, c in enumerate(self.caches)]
        self.new_k.append(keys)
        self.new_v.append(values)
        k_batch = pad_sequence(keys, batch_first=True)  # [B, T, kv_heads, dim], zero-padded
        v_batch = pad_sequence(values, batch_first=True)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k_batch.transpose(1, 2), v_batch.transpose(1, 2),
            attn_mask=self.mask, enable_gqa=True)
        return out.transpose(1, 2)  # [B, 1, heads, dim]

    def commit(self) -> None:
        """Give every user its grown cache (past + this step's K/V)."""
        for i, cache in enumerate(self.caches):
            cache.k = [layer[i] for layer in self.new_k]
            cache.v = [layer[i] for layer in self.new_v]


class BaselineRunner:
    """Runs the model for the baseline: one user's prefill, or one batched decode step."""

    def __init__(self, model: LlamaModel) -> None:
        if model.cfg.sliding_layers and any(model.cfg.sliding_layers):
            # The yardstick stays the default model's math: no sliding-window masks here.
            raise ValueError(f"the baseline server does not run {model.cfg.model_type} "
                             "(its sliding-window layers); serve it with server.py")
        self.model = model
        self.device = model.norm.weight.device  # (the embedding may be quantized)

    @torch.inference_mode()
    def prefill(self, token_ids: list[int], all_rows: bool = False) -> tuple[Tensor, UserKV]:
        """The last prompt token's logits [1, vocab] (every token's with all_rows), and the
        user's new cache."""
        attention = PrefillAttention()
        n = len(token_ids)
        rows = torch.arange(n, device=self.device) if all_rows else torch.tensor(
            [n - 1], device=self.device)
        logits = self.model(
            torch.tensor(token_ids, device=self.device), torch.arange(n, device=self.device),
            attention, logits_indices=rows)
        return logits, attention.cache

    @torch.inference_mode()
    def decode(self, caches: list[UserKV], last_tokens: list[int]) -> Tensor:
        """Logits [B, vocab] for each user's last token, at position = its cache length;
        afterwards each cache holds that token's K/V too."""
        attention = PaddedDecodeAttention(caches, self.device)
        input_ids = torch.tensor(last_tokens, device=self.device)[:, None]
        positions = torch.tensor([c.length for c in caches], device=self.device)[:, None]
        logits = self.model(input_ids, positions, attention)[:, -1]
        attention.commit()
        return logits


class BaselineEngineCore:
    """The baseline's engine core: seats first come first served up to max_num_seqs, with no
    memory limit and no preemption; prefills newcomers one at a time, then decodes everyone
    seated in one batched pass. Holds each seated request's cache."""

    def __init__(self, config: EngineConfig, model: LlamaModel,
                 eos_token_ids: Collection[int]) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)
        # --threads: every step on that many threads (None: PyTorch's default, the cores).
        self.threads = ThreadPolicy(config.threads, 0) if config.threads else None
        self.runner = BaselineRunner(model)
        self.sampler = Sampler(compiled=False)  # no compiled kernel (module docstring)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.caches: dict[str, UserKV] = {}  # request id -> its cache, once prefilled
        # Only RoPE's table bounds a request here: the caches grow without limit.
        self.max_tokens_per_request = model.cfg.max_position_embeddings

    def add(self, request: Request) -> None:
        # Samples of one prompt (n) are independent users here, each prefilling the prompt.
        self.waiting.extend([request, *request.pending_forks])
        request.pending_forks = []

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_waiting_tokens(self) -> int:
        return sum(r.num_tokens for r in self.waiting)

    def step(self) -> StepResult:
        """One round: seat newcomers, prefill them one by one, decode everyone seated."""
        result = StepResult()
        if self.threads is not None:
            self.threads.apply(0)  # on the thread that steps (the setting is per thread)
        for request in self._seat():
            self._prefill(request, result)
        decoding = [r for r in self.running if r.request_id in self.caches
                    and r.num_computed_tokens < r.num_tokens]
        if decoding:
            self._decode(decoding, result)
        return result

    def _seat(self) -> list[Request]:
        newcomers = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting.popleft()
            request.status = Status.RUNNING
            request.scheduled_time = time.monotonic()
            self.running.append(request)
            newcomers.append(request)
        return newcomers

    def _prefill(self, request: Request, result: StepResult) -> None:
        result.num_scheduled_tokens += request.num_prompt_tokens
        result.num_prompt_tokens += request.num_prompt_tokens
        scored = request.prompt_logprobs is not None
        try:
            logits, cache = self.runner.prefill(request.token_ids, all_rows=scored)
            if scored:
                k = request.params.prompt_logprobs or 0
                request.prompt_logprobs.extend(gather_logprobs(  # type: ignore[union-attr]
                    raw_logprobs(logits[:-1]), request.prompt_token_ids[1:],
                    [k] * (len(logits) - 1)))
            sampled = self.sampler.sample(logits[-1:], [request])
        except Exception as exc:  # a failed prefill fails only this request
            log.exception("prefill failed; failing request %s", request.request_id)
            result.failed.append(request)
            result.error = f"internal error in the baseline: {exc}"
            return
        self.caches[request.request_id] = cache
        request.num_computed_tokens = request.num_computed_prompt_tokens = request.num_tokens
        if request.params.max_tokens == 0:  # only the prompt's logprobs were asked for
            self.finish(request, FinishReason.LENGTH)
            result.updates.append(RequestUpdate(request, [], FinishReason.LENGTH))
            return
        self._append(request, sampled.token_ids[0], sampled.logprobs[0], result)

    def _decode(self, requests: list[Request], result: StepResult) -> None:
        result.num_scheduled_tokens += len(requests)
        try:
            logits = self.runner.decode([self.caches[r.request_id] for r in requests],
                                        [r.token_ids[-1] for r in requests])
            sampled = self.sampler.sample(logits, requests)
        except Exception as exc:  # a failed step fails only the requests in it
            log.exception("decode step failed; failing the %d requests in it", len(requests))
            result.failed.extend(requests)
            result.error = f"internal error in the baseline: {exc}"
            return
        for request, token, logprobs in zip(requests, sampled.token_ids, sampled.logprobs):
            request.num_computed_tokens += 1
            self._append(request, token, logprobs, result)

    def _append(self, request: Request, token: int, logprobs: TokenLogprobs | None,
                result: StepResult) -> None:
        reason = request.append_token(token, self.eos_token_ids, logprobs)
        if reason is not None:
            self.finish(request, reason)
        result.updates.append(RequestUpdate(request, [token], reason,
                                            [logprobs] if logprobs is not None else []))

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Unseat (or unqueue) a request for good, dropping its cache."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.caches.pop(request.request_id, None)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.status = Status.FINISHED
        request.finish_reason = reason

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.running), waiting=len(self.waiting), blocks_total=0,
                           blocks_used=0, blocks_free=0, blocks_cached_free=0)

    def describe(self) -> str:
        threads = (f", {self.threads.max_threads} threads" if self.threads is not None
                   else "")
        return (f"{self.runner.device}, per-user KV cache padded and concatenated every step, "
                f"up to {self.max_num_seqs} users at once{threads}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """server.py's command line, refusing (argparse's exit 2) each flag the baseline would
    not honour."""
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    for dest, value in given_flags(__doc__, argv).items():
        flag = "--" + dest.replace("_", "-")
        if dest in REFUSED:
            parser.error(f"{flag} is not supported by the baseline: {REFUSED[dest]}")
        if dest in FIXED and value != FIXED[dest][0]:
            only, why = FIXED[dest]
            parser.error(f"{flag} {value} is not supported by the baseline, only {flag} "
                         f"{only}: {why}")
    # Unused here, but the engine's config checks it against the seats.
    args.max_num_batched_tokens = max(args.max_num_batched_tokens, args.max_num_seqs)
    return args


def main() -> int:
    return run_server(__doc__, "nano-vLLM BASELINE", "baseline_server:BaselineEngineCore",
                      fixed={"matmul": "torch", "fused_ops": False, "weights": "default",
                             "activations": "float32", "lm_head": "default",
                             "scheduling_policy": "fcfs"},
                      args=parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
