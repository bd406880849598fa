"""The engine core of an embedding model: each step embeds whole inputs, packed flat.

An embedding request is a prompt with nothing to generate. It waits in line like any other
(first come first served, or by priority), and a step takes inputs from the front of the
line while their tokens fit the step's budget (--max-num-batched-tokens) and its seats
(--max-num-seqs): one forward pass over all of them, one vector each, and they are done.
Nothing is kept between steps: an encoder's input is computed whole, once, so there is no
KV cache and no block to free.

A bidirectional model cannot be prefilled in chunks (each token sees the tokens after it),
so an input longer than the step's budget runs in a step of its own: the front of the line
always goes, whatever its size (up to the model's longest input, which the API checks).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection

from engine.config import EngineConfig
from engine.core import EngineStats, StepResult, describe_threads
from engine.cpu_load import ContentionWatch
from engine.model_runner import ThreadPolicy
from engine.request import FinishReason, Request, Status
from engine.step_types import RequestUpdate
from engine.waiting_queue import make_waiting_queue
from model.embedding import EmbeddingModel

log = logging.getLogger("nano_vllm.engine")


class EmbeddingEngineCore:
    """The EngineCore (engine/core.py) of an EmbeddingModel."""

    def __init__(self, config: EngineConfig, model: EmbeddingModel,
                 eos_token_ids: Collection[int]) -> None:
        self.config = config
        self.model = model
        self.waiting = make_waiting_queue(config.scheduling_policy, config.priority_aging)
        cfg, info = model.cfg, model.info
        self.max_tokens_per_request = min(info.max_seq_length or cfg.max_position_embeddings,
                                          cfg.max_position_embeddings)
        most = config.threads or len(os.sched_getaffinity(0))
        # Every step on all threads (a step embeds many tokens), fewer while other processes
        # hold cores; set on the thread that steps (the setting is per thread).
        self.threads = ThreadPolicy(most, 0, watch=ContentionWatch(most)
                                    if config.yield_cores else None)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return len(self.waiting) > 0

    def num_waiting_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.waiting)

    def finish(self, request: Request, reason: FinishReason) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        request.status, request.finish_reason = Status.FINISHED, reason

    def schedule(self) -> list[Request]:
        """The inputs of the next step: the line's front, then each next one while the step's
        tokens and seats allow."""
        taken: list[Request] = []
        tokens = 0
        while len(self.waiting) and len(taken) < self.config.max_num_seqs:
            size = self.waiting[0].num_prompt_tokens
            if taken and tokens + size > self.config.max_num_batched_tokens:
                break
            taken.append(self.waiting.popleft())
            tokens += size
        return taken

    def step(self) -> StepResult:
        batch = self.schedule()
        tokens = sum(r.num_prompt_tokens for r in batch)
        result = StepResult(num_scheduled_tokens=tokens, num_prompt_tokens=tokens,
                            embedded_inputs=len(batch))
        if not batch:
            return result
        self.threads.apply(tokens)
        now = time.monotonic()
        for request in batch:
            request.status, request.scheduled_time = Status.RUNNING, now
        generating = [r for r in batch if r.params.max_tokens > 0]
        if generating:  # the API never sends these; refuse them whole rather than embed
            result.failed = batch
            result.error = "this model computes embeddings and generates no text"
            return result
        try:
            vectors = self.model.embed([r.prompt_token_ids for r in batch])
        except Exception as exc:  # a failed run fails its requests, not the server
            log.exception("embedding step failed; failing the %d requests in it", len(batch))
            result.failed = batch
            result.error = f"internal error in the engine: {exc}"
            return result
        for request, vector in zip(batch, vectors.tolist(), strict=True):
            request.num_computed_tokens = request.num_computed_prompt_tokens = \
                request.num_prompt_tokens
            request.status = Status.FINISHED
            result.updates.append(RequestUpdate(request, [], FinishReason.STOP,
                                                embedding=vector))
        return result

    def stats(self) -> EngineStats:
        return EngineStats(running=0, waiting=len(self.waiting), blocks_total=0, blocks_used=0,
                           blocks_free=0, blocks_cached_free=0)

    def describe(self) -> str:
        info = self.model.info
        weights = sum(t.numel() * t.element_size()
                      for t in (*self.model.parameters(), *self.model.buffers()))
        sizes = "/".join(str(d) for d in info.matryoshka_dimensions)
        return (f"embedding model ({self.model.pooling} pooling, {sizes} dimensions, inputs up "
                f"to {self.max_tokens_per_request} tokens), weights {weights / 1024**3:.2f} "
                f"GiB, no KV cache, {self.config.max_num_batched_tokens} tokens a step, "
                + describe_threads(self.threads.max_threads, 0))
