"""Attention of an encoder: several whole sequences packed one after another in one batch
([tokens, heads, head_dim]), each attending to all of itself, both ways, and never to its
neighbours. Nothing is cached: an encoder's sequence is computed once, whole.

A sliding layer of a bidirectional model (EmbeddingGemma) lets a token see those within
`window // 2` positions either side, itself included: |i - j| <= window // 2, as Hugging
Face's Gemma 3 does when `use_bidirectional_attention` is set.

Sequences of the same length run as one batch of PyTorch's scaled_dot_product_attention; a
step of many short texts has few distinct lengths, so it makes a few calls, not one a text.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import Tensor


class PackedBidirectionalAttention:
    """The `attention` callable of a model run over packed whole sequences (model/layers.py
    AttentionFn), for the lengths given, in order."""

    def __init__(self, seq_lens: list[int]) -> None:
        starts = [0]
        for n in seq_lens:
            starts.append(starts[-1] + n)
        by_length: dict[int, list[int]] = defaultdict(list)
        for start, n in zip(starts, seq_lens, strict=False):
            by_length[n].append(start)
        # Per length: the rows of every sequence of that length, [count, length].
        self.groups = {n: torch.tensor(s)[:, None] + torch.arange(n)
                       for n, s in by_length.items()}
        self.num_tokens = starts[-1]
        self._masks: dict[tuple[int, int], Tensor] = {}

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor,
                 window: int | None = None) -> Tensor:
        out = torch.empty_like(q)
        for n, rows in self.groups.items():
            # [count, length, heads, dim] -> [count, heads, length, dim]
            qs, ks, vs = (t[rows].transpose(1, 2) for t in (q, k, v))
            reach = None if window is None else window // 2
            mask = None if reach is None or n <= reach + 1 else self._band(n, reach, q.device)
            attended = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                      enable_gqa=True)
            out[rows] = attended.transpose(1, 2)
        return out

    def _band(self, n: int, reach: int, device: torch.device) -> Tensor:
        """True where |i - j| <= reach, for a sequence of n tokens."""
        key = (n, reach)
        if key not in self._masks:
            pos = torch.arange(n, device=device)
            self._masks[key] = (pos[:, None] - pos[None, :]).abs() <= reach
        return self._masks[key]
