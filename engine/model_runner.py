"""Runs one scheduled step: builds the input tensors, runs the model over the paged cache,
samples. The runner owns the attention backend and the sampler; it reads each request's
position and block table but changes nothing in it (the scheduler does that)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput
from kvcache.pool import KVCachePool
from model.attention import create_backend
from model.llama import LlamaModel


@dataclass
class SequenceStep:
    """One sequence's share of a step: compute `token_ids`, which sit at positions
    start_pos, start_pos + 1, ...; its block table already covers them."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    need_logits: bool  # False for a chunk that stops short of the sequence's last token

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class RunnerOutput:
    """sampled_token_ids[i]: the new tokens of the i-th scheduled request (empty for a prompt
    chunk that stops short of the prompt's end). A list, so that a step may one day give a
    request several tokens (speculative decoding); logprobs will sit beside it."""

    sampled_token_ids: list[list[int]]


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: KVCachePool, attention_backend: str = "auto",
                 ) -> None:
        self.model = model
        self.pool = pool
        self.device = model.embed_tokens.weight.device
        self.attention = create_backend(attention_backend, pool)
        self.attention_backend = self.attention.name
        self.sampler = Sampler()

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Compute every scheduled token and sample for each request that reaches its end."""
        steps, sampling = [], []
        for request, n in scheduled.scheduled:
            start = request.num_computed_tokens
            reaches_end = start + n == request.num_tokens
            steps.append(SequenceStep(request.token_ids[start:start + n], start,
                                      request.blocks.block_table, reaches_end))
            if reaches_end:
                sampling.append(request)
        logits = self.compute_logits(steps)
        tokens = iter(self.sampler(logits, sampling) if sampling else [])
        return RunnerOutput([[next(tokens)] if s.need_logits else [] for s in steps])

    @torch.inference_mode()
    def compute_logits(self, steps: list[SequenceStep]) -> Tensor:
        """Logits [number of steps that need them, vocab], in the order of `steps`."""
        # One-token sequences go first: they attend together in one batched call.
        single = [i for i, s in enumerate(steps) if len(s.token_ids) == 1]
        chunks = [i for i, s in enumerate(steps) if len(s.token_ids) > 1]
        input_ids: list[int] = []
        positions: list[int] = []
        last_row = [0] * len(steps)  # step index -> its last row in the flat batch
        for i in single + chunks:
            s = steps[i]
            input_ids.extend(s.token_ids)
            positions.extend(range(s.start_pos, s.context_len))
            last_row[i] = len(input_ids) - 1
        rows = [last_row[i] for i, s in enumerate(steps) if s.need_logits]
        self.attention.step = self.attention.build_metadata(
            [(steps[i].block_table, steps[i].context_len) for i in single],
            [(steps[i].block_table, steps[i].context_len, len(steps[i].token_ids))
             for i in chunks])
        try:
            return self.model(
                torch.tensor(input_ids, device=self.device),
                torch.tensor(positions, device=self.device),
                self.attention,
                logits_indices=torch.tensor(rows, dtype=torch.long, device=self.device),
            )
        finally:
            self.attention.step = None
