"""Choosing the next token from a batch of logits: greedy, or temperature / top-k / top-p.

Everything is done on the whole batch at once; the only per-row work is drawing each
sampled row's random numbers from its own generator (seeded requests must not depend on
who else is in the batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.request import Request


class Sampler:
    def __call__(self, logits: Tensor, requests: list[Request]) -> list[int]:
        """One token per row of logits [n, vocab]; row i belongs to requests[i]."""
        tokens = argmax_rows(logits)  # greedy for everyone; sampled rows overwrite
        rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        if rows:
            sampled = [requests[i] for i in rows]
            probs = self.probabilities(logits[rows], sampled)
            for i, token in zip(rows, self.draw(probs, sampled).tolist()):
                tokens[i] = token
        return tokens

    @staticmethod
    def probabilities(logits: Tensor, requests: list[Request]) -> Tensor:
        """Each row's distribution after temperature, top-k, then top-p."""
        logits = logits.float()
        temperature = logits.new_tensor([r.params.temperature for r in requests])
        logits = logits / temperature[:, None]
        top_k = [r.params.top_k for r in requests]
        top_p = [r.params.top_p for r in requests]
        if not any(top_k) and all(p >= 1.0 for p in top_p):
            return torch.softmax(logits, dim=-1)
        return top_k_top_p(logits, logits.new_tensor(top_k, dtype=torch.long),
                           logits.new_tensor(top_p))

    @staticmethod
    def draw(probs: Tensor, requests: list[Request]) -> Tensor:
        """A sample from each row: argmax(p / e) with e ~ Exp(1) picks index i with
        probability p_i. Each row's noise comes from its request's (CPU) generator."""
        noise = torch.stack([torch.empty(probs.shape[-1]).exponential_(generator=r.generator)
                             for r in requests]).to(probs.device)
        return (probs / noise).argmax(dim=-1)


def argmax_rows(logits: Tensor) -> list[int]:
    """Each row's argmax. On a CPU through NumPy: torch's argmax over 30 x 49,152 logits took
    0.4 ms in fp32 and 2.5 ms in bf16 here, NumPy's 0.07 and 0.5 (widening bf16 included)."""
    if logits.device.type == "cpu":
        return logits.float().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Probabilities keeping, per row, the top_k most likely tokens (0 = all), then the
    smallest set of those whose mass reaches top_p (always at least the top token)."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    rank = torch.arange(vocab, device=logits.device)
    sorted_logits = sorted_logits.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None]
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)
