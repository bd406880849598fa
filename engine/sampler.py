"""Choosing the next token from logits, per request: greedy, or temperature/top-k/top-p."""

from __future__ import annotations

import torch
from torch import Tensor

from engine.request import SamplingParams


def sample(logits: Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of logits [n, vocab]."""
    tokens = logits.argmax(dim=-1).tolist()  # greedy for everyone; sampled rows overwrite
    for row, (p, gen) in enumerate(zip(params, generators)):
        if not p.greedy:
            tokens[row] = sample_one(logits[row], p, gen)
    return tokens


def sample_one(logits: Tensor, p: SamplingParams, generator: torch.Generator | None) -> int:
    # On the CPU, where each request's seeded generator lives (one row: cheap to move).
    logits = logits.float().cpu() / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest set whose mass reaches top_p (always at least the top token).
        outside = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())
