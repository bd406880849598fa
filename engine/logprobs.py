"""Log-probabilities of chosen tokens and their most likely alternatives, batched.

A step may ask for logprobs on many rows at once (every sampled row that wants them, every
prompt row of a request that wants prompt logprobs): one log-softmax, one gather and one
top-k over all of them, then a single copy to Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

# "raw": log-softmax of the model's logits (vLLM V1's default); "processed": of the
# distribution actually sampled from, after temperature, top-k and top-p.
LogprobsMode = Literal["raw", "processed"]
DEFAULT_LOGPROBS_MODE: LogprobsMode = "raw"
MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprobs:
    """One position: the chosen token's log-probability, and the `top` most likely tokens
    (most likely first, as many as were asked for)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def raw_logprobs(logits: Tensor) -> Tensor:
    """Log-softmax in fp32, whatever the model's dtype."""
    return torch.log_softmax(logits.float(), dim=-1)


def gather_logprobs(logprobs: Tensor, token_ids: list[int],
                    num_top: list[int]) -> list[TokenLogprobs]:
    """Row i of logprobs [n, vocab]: token_ids[i]'s value and the num_top[i] best tokens."""
    if not token_ids:
        return []
    ids = torch.tensor(token_ids, device=logprobs.device)
    chosen = logprobs.gather(1, ids[:, None]).squeeze(1).tolist()
    k = max(num_top)
    top_values: list[list[float]] = [[] for _ in token_ids]
    top_ids: list[list[int]] = [[] for _ in token_ids]
    if k > 0:
        values, indices = logprobs.topk(k, dim=-1)
        top_values, top_ids = values.tolist(), indices.tolist()
    return [TokenLogprobs(token_ids[i], chosen[i],
                          list(zip(top_ids[i][:num_top[i]], top_values[i][:num_top[i]],
                                   strict=True)))
            for i in range(len(token_ids))]
