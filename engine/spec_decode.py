"""Speculative decoding without a draft model: n-gram prompt lookup, verified exactly.

Drafting: the last n tokens of a request (n from prompt_lookup_max down to
prompt_lookup_min) are looked up earlier in its own tokens, prompt and output so far;
the tokens that followed the most recent match are the draft. When an answer copies
from its prompt (an edit, an extraction, a quote), the draft is often right.

Verification: the scheduler gives a drafting request its last token plus k drafts in one
step; the model computes all k + 1 rows in one pass, so row j is the target's
distribution for the token after draft j. The drafts are then checked in order:

- greedy: draft j is kept while it is row j's argmax; the first row that disagrees gives
  its argmax instead, and if all k agree, row k gives one more (the "bonus") token. The
  tokens are those decoding without speculation would have produced.
- sampled: an n-gram draft is deterministic (it proposes d with probability 1), so
  rejection sampling keeps draft d with the target's probability p(d); on a rejection the
  token is drawn from p with d taken out (the residual max(p - q, 0), normalised). Each
  emitted token is thus distributed exactly as p, as without speculation.

Rows past a rejection are dropped, and so are their K/V: the scheduler counts only the
accepted tokens as computed, so their slots are written again by the next step.

When: a step speculates only while few requests are seated (`disable_by_batch_size`), and a
request whose drafts all failed pauses drafting for a few steps (`note_drafts`).
For one user a step reads all the weights for one row, so 5 rows cost about as much as
one; with 30 seated the step is compute-bound and drafts that fail would cost real time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from engine.request import Request
from engine.sampler import Sampler, argmax_rows


@dataclass
class SpeculativeConfig:
    """`--speculative-config`, with vLLM's keys for the n-gram method."""

    method: str = "ngram"
    num_speculative_tokens: int = 4  # k: drafts verified per step
    prompt_lookup_max: int = 4  # longest suffix looked up
    prompt_lookup_min: int = 2  # shortest suffix that may match
    # No speculation in a step where more requests than this are seated (vLLM's key; here it
    # counts seated requests). Measured (README): 1-2 users gain, 30 would lose.
    disable_by_batch_size: int = 4

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not valid JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("--speculative-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"--speculative-config: unknown keys {unknown} (known: "
                             f"{sorted(known)})")
        for key, value in values.items():
            if key != "method" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"--speculative-config: {key} must be an integer")
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"--speculative-config: method {self.method!r} is not supported "
                             "(only 'ngram': no draft model)")
        if self.num_speculative_tokens < 1:
            raise ValueError("--speculative-config: num_speculative_tokens must be at least 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("--speculative-config: need 1 <= prompt_lookup_min <= "
                             "prompt_lookup_max")
        if self.disable_by_batch_size < 1:
            raise ValueError("--speculative-config: disable_by_batch_size must be at least 1")


def describe_speculation(config: SpeculativeConfig) -> str:
    """For the startup line."""
    return (f"n-gram speculation ({config.num_speculative_tokens} drafts, lookup "
            f"{config.prompt_lookup_min}-{config.prompt_lookup_max} tokens, up to "
            f"{config.disable_by_batch_size} seated)")


def can_speculate(request: Request) -> bool:
    """Whether a request's tokens may be drafted and verified. Not for requests that want
    logprobs (each verified row would need its own), nor for requests whose logits are
    processed (penalties, logit_bias, min_p, a grammar: engine/logits_processors.py), which
    see one row at a time."""
    params = request.params
    return (params.logprobs is None and not params.needs_logits_processing
            and request.forced_token is None)


MAX_DRAFT_PAUSE = 16  # steps


def note_drafts(request: Request, accepted: int) -> None:
    """After drafts that all failed, pause drafting for 1, 2, 4, ... steps (each failed
    verification costs a step of k + 1 tokens for one token); any accepted draft resets it.
    Free writing finds n-gram matches now and then, rarely right ones."""
    if accepted:
        request.draft_failures = 0
        return
    request.draft_pause = min(2 ** request.draft_failures, MAX_DRAFT_PAUSE)
    request.draft_failures += 1


def propose_ngram(token_ids: list[int], config: SpeculativeConfig, max_drafts: int) -> list[int]:
    """Up to max_drafts tokens that followed the most recent earlier occurrence of the
    longest matching suffix (prompt_lookup_max down to prompt_lookup_min tokens); [] if
    none matches."""
    k = min(max_drafts, config.num_speculative_tokens)
    length = len(token_ids)
    if k <= 0 or length <= config.prompt_lookup_min:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(config.prompt_lookup_max, length - 1), config.prompt_lookup_min - 1, -1):
        # Windows starting at 0 .. length - n - 1: every n-gram except the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if starts.size:
            follow = int(starts[-1]) + n
            return tokens[follow:follow + k].tolist()
    return []


def verify(logits: Tensor, drafts: list[int], request: Request) -> list[int]:
    """The tokens a request gains from one verified step: the accepted drafts, then one
    token from the first row that rejected (or from the last row if none did).

    logits: [len(drafts) + 1, vocab], row j the target's logits after draft j - 1."""
    if request.params.greedy:
        best = argmax_rows(logits)
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == best[accepted]:
            accepted += 1
        return [*drafts[:accepted], best[accepted]]
    probs = Sampler.probabilities(logits, [request] * len(logits))
    # One uniform per draft, from the request's own generator (seeded runs repeat).
    uniform = torch.rand(len(drafts), generator=request.generator).tolist()
    for j, draft in enumerate(drafts):
        if uniform[j] < probs[j, draft].item():
            continue
        residual = probs[j].clone()
        residual[draft] = 0.0
        residual /= residual.sum()
        return drafts[:j] + Sampler.draw(residual[None], [request]).tolist()
    return drafts + Sampler.draw(probs[-1:], [request]).tolist()
