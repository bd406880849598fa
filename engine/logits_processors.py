"""Logits processors: what a request's sampling parameters do to its logits before the
sampler chooses (penalties, logit_bias, allowed_token_ids, a grammar's mask, a thinking
budget's forced end), and min_p.

Each is applied to all the rows that ask for it at once, as tensors: per-row Python work is
only gathering each request's token ids and its grammar's mask, never a loop over the vocab.
Order, as in vLLM: allowed tokens, logit_bias, penalties, then the grammar's mask (a token
the grammar forbids stays forbidden whatever the bias); last, a forced token is the only one
left (engine/thinking.py: the end of a thinking span whose budget ran out)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from engine.request import Request


def apply_logits_processors(logits: Tensor, requests: list[Request]) -> Tensor:
    """The logits [n, vocab] each row's request should choose from: `logits` itself when no
    row asks for a processor, else a float32 copy with them applied."""
    rows = [i for i, r in enumerate(requests) if changes_logits(r)]
    if not rows:
        return logits
    out = logits.to(torch.float32, copy=True)
    sub = out[rows]
    chosen = [requests[i] for i in rows]
    sub = mask_allowed_tokens(sub, [r.params.allowed_token_ids for r in chosen])
    sub = add_logit_bias(sub, [r.params.logit_bias for r in chosen])
    sub = apply_penalties(sub, chosen)
    sub = mask_grammar(sub, chosen)
    sub = force_tokens(sub, [r.forced_token for r in chosen])
    out[rows] = sub
    return out


def changes_logits(request: Request) -> bool:
    p = request.params
    return (p.presence_penalty != 0 or p.frequency_penalty != 0 or p.repetition_penalty != 1
            or bool(p.logit_bias) or p.allowed_token_ids is not None or p.has_grammar
            or request.forced_token is not None)


def mask_allowed_tokens(logits: Tensor, allowed: list[list[int] | None]) -> Tensor:
    """-inf outside each row's allowed tokens (rows with None keep all)."""
    rows = [i for i, ids in enumerate(allowed) if ids is not None]
    if not rows:
        return logits
    keep = torch.zeros(len(rows), logits.shape[-1], dtype=torch.bool)
    row_index, token_index = flat_index([allowed[i] or [] for i in rows])
    keep[row_index, token_index] = True
    logits[rows] = logits[rows].masked_fill(~keep.to(logits.device), float("-inf"))
    return logits


def add_logit_bias(logits: Tensor, biases: list[dict[int, float]]) -> Tensor:
    """Each row's bias added to its tokens' logits."""
    if not any(biases):
        return logits
    row_index, token_index = flat_index([list(b) for b in biases])
    values = torch.tensor([v for b in biases for v in b.values()], dtype=logits.dtype)
    logits.index_put_((row_index.to(logits.device), token_index.to(logits.device)),
                      values.to(logits.device), accumulate=True)
    return logits


def apply_penalties(logits: Tensor, requests: list[Request]) -> Tensor:
    """repetition_penalty over the tokens of prompt and output (a logit above 0 divided by it,
    else multiplied, as Hugging Face and vLLM do); then frequency_penalty times each token's
    count in the output, and presence_penalty once per token in it, subtracted (OpenAI's
    definition; vLLM's order)."""
    params = [r.params for r in requests]
    if all(p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
           for p in params):
        return logits
    vocab = logits.shape[-1]
    device = logits.device
    output_counts = token_counts([r.token_ids[r.num_prompt_tokens:] for r in requests],
                                 vocab).to(device)
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device)
    if bool((repetition != 1).any()):
        seen = (token_counts([r.prompt_token_ids for r in requests], vocab).to(device) > 0) | (
            output_counts > 0)
        penalized = torch.where(logits > 0, logits / repetition[:, None],
                                logits * repetition[:, None])
        logits = torch.where(seen, penalized, logits)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)
    presence = torch.tensor([p.presence_penalty for p in params], device=device)
    logits = logits - (frequency[:, None] * output_counts
                       + presence[:, None] * (output_counts > 0))
    return logits


def mask_grammar(logits: Tensor, requests: list[Request]) -> Tensor:
    """-inf on the tokens each constrained row's grammar forbids next (none inside a
    thinking span; before the output starts, a thinking model's open tag is allowed too)."""
    rows = [i for i, r in enumerate(requests) if r.grammar_applies]
    if not rows:
        return logits
    packed = np.stack([requests[i].grammar.allowed_bits() for i in rows])  # type: ignore[union-attr]
    allowed = np.unpackbits(packed, axis=1, bitorder="little").astype(bool)
    for row, i in enumerate(rows):
        thinking = requests[i].thinking
        opening = None if thinking is None else thinking.may_open
        if opening is not None and opening < allowed.shape[1]:
            allowed[row, opening] = True
    vocab = logits.shape[-1]
    if allowed.shape[1] < vocab:  # a model vocab padded past the tokenizer's: never allowed
        allowed = np.pad(allowed, ((0, 0), (0, vocab - allowed.shape[1])))
    keep = torch.from_numpy(allowed[:, :vocab]).to(logits.device)
    logits[rows] = logits[rows].masked_fill(~keep, float("-inf"))
    return logits


def force_tokens(logits: Tensor, forced: list[int | None]) -> Tensor:
    """In the rows that have a forced token, -inf on every other token (the forced one keeps
    its logit, or 0 where an earlier mask had removed it)."""
    rows = [i for i, token in enumerate(forced) if token is not None]
    if not rows:
        return logits
    tokens = torch.tensor([forced[i] for i in rows], device=logits.device)
    kept = logits[rows, tokens].nan_to_num(neginf=0.0)
    logits[rows] = float("-inf")
    logits[rows, tokens] = kept
    return logits


def apply_min_p(logits: Tensor, min_p: Tensor) -> Tensor:
    """-inf on tokens whose probability is below min_p times the row's top probability
    (logits after temperature; a row with min_p 0 keeps all)."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


def token_counts(token_lists: list[list[int]], vocab: int) -> Tensor:
    """[len(token_lists), vocab] float32: how often each token occurs in each list."""
    counts = torch.zeros(len(token_lists), vocab + 1)  # the last column takes the padding
    width = max((len(t) for t in token_lists), default=0)
    if width == 0:
        return counts[:, :vocab]
    ids = torch.full((len(token_lists), width), vocab, dtype=torch.long)
    for i, tokens in enumerate(token_lists):
        ids[i, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    counts.scatter_add_(1, ids, torch.ones(ids.shape))
    return counts[:, :vocab]


def flat_index(token_lists: list[list[int]]) -> tuple[Tensor, Tensor]:
    """(row, token) index tensors of every token of every row."""
    rows = [i for i, tokens in enumerate(token_lists) for _ in tokens]
    tokens = [t for ts in token_lists for t in ts]
    return torch.tensor(rows, dtype=torch.long), torch.tensor(tokens, dtype=torch.long)
