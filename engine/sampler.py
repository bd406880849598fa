"""Choosing the next token from a batch of logits: greedy, or temperature / min-p / top-k /
top-p, after the logits processors (engine/logits_processors.py); and the chosen tokens'
logprobs for the rows that ask for them (raw: before any processing).

Everything is done on the whole batch at once; the only per-row work is drawing each
sampled row's random numbers from its own generator (seeded requests must not depend on
who else is in the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.logits_processors import apply_logits_processors, apply_min_p
from engine.logprobs import TokenLogprobs, gather_logprobs, raw_logprobs
from engine.request import Request
from model.kernels.build import load_cpu_kernels


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # one per row; None where the request asked for none


def wants_processed(request: Request) -> bool:
    return request.params.logprobs is not None and request.params.logprobs_mode == "processed"


class Sampler:
    def __init__(self, compiled: bool = True) -> None:
        self.compiled = compiled  # greedy rows by the compiled argmax where it applies

    def __call__(self, logits: Tensor, requests: list[Request]) -> list[int]:
        """One token per row of logits [n, vocab]; row i belongs to requests[i]."""
        return self.sample(logits, requests).token_ids

    def sample(self, logits: Tensor, requests: list[Request]) -> SamplerOutput:
        """One token per row, and its logprobs where the row's request asks for them."""
        adjusted = apply_logits_processors(logits, requests)
        tokens = argmax_rows(adjusted, self.compiled)  # greedy for all; sampled rows overwrite
        # Rows whose processed distribution is needed: to draw from, or for its logprobs.
        rows = [i for i, r in enumerate(requests) if not r.params.greedy or wants_processed(r)]
        processed = None
        if rows:
            processed = self.processed_logits(adjusted[rows], [requests[i] for i in rows])
            drawn = [j for j, i in enumerate(rows) if not requests[i].params.greedy]
            if drawn:
                probs = torch.softmax(processed[drawn], dim=-1)
                drawn_tokens = self.draw(probs, [requests[rows[j]] for j in drawn]).tolist()
                for j, token in zip(drawn, drawn_tokens, strict=True):
                    tokens[rows[j]] = token
        token_ids = tokens
        return SamplerOutput(token_ids, self.logprobs(logits, processed, rows, requests,
                                                      token_ids))

    @staticmethod
    def logprobs(logits: Tensor, processed: Tensor | None, processed_rows: list[int],
                 requests: list[Request], token_ids: list[int]) -> list[TokenLogprobs | None]:
        """The chosen tokens' logprobs: raw rows from `logits`, processed ones from
        `processed` (whose row j is row processed_rows[j])."""
        raw = [i for i, r in enumerate(requests)
               if r.params.logprobs is not None and not wants_processed(r)]
        cooked = [j for j, i in enumerate(processed_rows) if wants_processed(requests[i])]
        order = raw + [processed_rows[j] for j in cooked]
        if not order:
            return [None] * len(requests)
        parts = [raw_logprobs(logits[raw])] if raw else []
        if cooked:
            assert processed is not None
            parts.append(torch.log_softmax(processed[cooked], dim=-1))
        found = gather_logprobs(torch.cat(parts), [token_ids[i] for i in order],
                                [requests[i].params.logprobs or 0 for i in order])
        result: list[TokenLogprobs | None] = [None] * len(requests)
        for i, logprobs in zip(order, found, strict=True):
            result[i] = logprobs
        return result

    @staticmethod
    def processed_logits(logits: Tensor, requests: list[Request]) -> Tensor:
        """Each row's logits after temperature (none for greedy rows), then min-p, top-k and
        top-p (-inf outside): the distribution a sampled row is drawn from."""
        logits = logits.float()
        temperature = logits.new_tensor([r.params.temperature or 1.0 for r in requests])
        logits = logits / temperature[:, None]
        min_p = [r.params.min_p for r in requests]
        if any(min_p):
            logits = apply_min_p(logits, logits.new_tensor(min_p))
        top_k = [r.params.top_k for r in requests]
        top_p = [r.params.top_p for r in requests]
        if not any(top_k) and all(p >= 1.0 for p in top_p):
            return logits
        return top_k_top_p_logits(logits, logits.new_tensor(top_k, dtype=torch.long),
                                  logits.new_tensor(top_p))

    @classmethod
    def probabilities(cls, logits: Tensor, requests: list[Request]) -> Tensor:
        """Each row's distribution after temperature, min-p, top-k, then top-p."""
        return torch.softmax(cls.processed_logits(logits, requests), dim=-1)

    @staticmethod
    def draw(probs: Tensor, requests: list[Request]) -> Tensor:
        """A sample from each row: argmax(p / e) with e ~ Exp(1) picks index i with
        probability p_i. Each row's noise comes from its request's (CPU) generator."""
        noise = torch.stack([torch.empty(probs.shape[-1]).exponential_(generator=r.generator)
                             for r in requests]).to(probs.device)
        return (probs / noise).argmax(dim=-1)


def top_k_top_p_logits(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Logits keeping, per row, the top_k most likely tokens (0 = all), then the smallest set
    of those whose mass reaches top_p (always at least the top token); -inf elsewhere."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    rank = torch.arange(vocab, device=logits.device)
    sorted_logits = sorted_logits.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, sorted_logits)


def argmax_rows(logits: Tensor, compiled: bool = True) -> list[int]:
    """Each row's argmax (the first of equals; a NaN counts as the largest). On a CPU by the
    kernel in model/kernels/csrc/argmax_cpu.cpp (rows split over the step's threads, bf16 read as it
    is) where `compiled`, else through NumPy, which is faster than torch's own argmax on a
    CPU (most of all in bf16). One fp32 row stays on NumPy, whose SIMD scan is faster alone
    (benchmarks/studies/argmax_cost.py)."""
    if logits.device.type != "cpu":
        return logits.argmax(dim=-1).tolist()
    kernels = load_cpu_kernels() if compiled else None
    if (kernels is not None and logits.dim() == 2 and logits.stride(-1) == 1
            and (logits.dtype == torch.bfloat16
                 or (logits.dtype == torch.float32 and logits.shape[0] > 1))):
        return kernels.argmax_rows(logits).tolist()
    return logits.float().numpy().argmax(axis=-1).tolist()


def top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """The probabilities of top_k_top_p_logits."""
    return torch.softmax(top_k_top_p_logits(logits, top_k, top_p), dim=-1)
