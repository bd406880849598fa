"""Turns one step's scheduled work into tensors and runs the model over the paged cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kvcache.pool import KVCachePool
from model.cpu_kernel import load_paged_decode_attention
from model.llama import LlamaModel
from model.paged_attention import PagedAttention, StepMetadata


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


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: KVCachePool, attention_backend: str = "torch",
                 ) -> None:
        self.model = model
        self.pool = pool
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        self.attention_backend = self.choose_backend(attention_backend)
        kernel = load_paged_decode_attention() if self.attention_backend == "cpu-kernel" else None
        if kernel is None:
            self.attention_backend = "torch"
        self.attention = PagedAttention(pool, kernel)

    def choose_backend(self, requested: str) -> str:
        """'auto': the compiled kernel where it applies (CPU, fp32), else gather + SDPA."""
        fits = self.device.type == "cpu" and self.dtype == torch.float32
        if requested == "auto":
            return "cpu-kernel" if fits else "torch"
        if requested == "cpu-kernel" and not fits:
            raise ValueError("--attention cpu-kernel needs --device cpu and --dtype float32")
        return requested

    @torch.inference_mode()
    def run(self, steps: list[SequenceStep]) -> Tensor:
        """Logits [number of steps that need them, vocab], in the order of `steps`."""
        # One-token sequences go first: they attend together in one batched call.
        order = sorted(range(len(steps)), key=lambda i: len(steps[i].token_ids) > 1)
        single = [steps[i] for i in order if len(steps[i].token_ids) == 1]
        chunks = [steps[i] for i in order if len(steps[i].token_ids) > 1]

        input_ids: list[int] = []
        positions: list[int] = []
        last_row: dict[int, int] = {}  # step index -> its last row in the flat batch
        for i in order:
            s = steps[i]
            input_ids.extend(s.token_ids)
            positions.extend(range(s.start_pos, s.context_len))
            last_row[i] = len(input_ids) - 1
        rows = [last_row[i] for i in range(len(steps)) if steps[i].need_logits]

        self.attention.step = StepMetadata.build(
            [(s.block_table, s.context_len) for s in single],
            [(s.block_table, s.context_len, len(s.token_ids)) for s in chunks],
            self.device, self.dtype)
        try:
            return self.model(
                torch.tensor(input_ids, device=self.device),
                torch.tensor(positions, device=self.device),
                self.attention,
                logits_indices=torch.tensor(rows, dtype=torch.long, device=self.device),
            )
        finally:
            self.attention.step = None
