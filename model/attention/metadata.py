"""What one engine step tells attention: where each new K/V goes, and who attends to what.

A step's tokens are laid out flat: first the single-token sequences (decodes, and
prefills with one token left to compute), then the multi-token chunks (prefills).

Sliding-window layers (Gemma 3) need their own masks: a query at position p sees keys
p - window + 1 .. p. Those are built on the first layer that asks for a window, and kept for
the step's other layers of the same window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from kvcache.pool import BLOCK_SIZE


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where allowed, -inf elsewhere. Masked scores become exactly -inf, so whatever sits
    in an unused or stale slot gets softmax weight 0 (as long as it is finite)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf"))


def slot(table: list[int], pos: int) -> int:
    """Where token `pos` of a sequence lives in the flattened pool."""
    return table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the flat batch
    length: int  # tokens computed now
    context_len: int  # tokens of the sequence after this chunk (cached + new)
    block_table: Tensor  # [blocks covering context_len]
    mask_dtype: torch.dtype = torch.float32
    window_masks: dict[int, tuple[int, Tensor]] = field(default_factory=dict)
    full_mask: Tensor | None = field(default=None, repr=False)

    @property
    def mask(self) -> Tensor | None:
        """[length, context_len]: 0 = may attend, -inf = not; None when nothing is cached
        before this chunk (plain causal). Built on first use: a backend that reads the
        cache in place never asks."""
        if self.full_mask is None and self.context_len > self.length:
            self.full_mask = chunk_mask(self.context_len - self.length, self.context_len,
                                        self.block_table.device, self.mask_dtype)
        return self.full_mask

    def window_keys(self, window: int, dtype: torch.dtype) -> tuple[int, Tensor]:
        """For a sliding-window layer: the first block any query of this chunk can see, and
        the mask over the keys from that block on ([length, context_len - 16 * block]). Each
        query sees its own key and the window - 1 before it."""
        if window not in self.window_masks:
            device = self.block_table.device
            first = self.context_len - self.length
            first_block = max(0, first - window + 1) // BLOCK_SIZE
            keys = torch.arange(first_block * BLOCK_SIZE, self.context_len, device=device)
            queries = torch.arange(first, self.context_len, device=device)
            distance = queries[:, None] - keys[None, :]
            self.window_masks[window] = (first_block, additive_mask(
                (distance >= 0) & (distance < window), dtype))
        return self.window_masks[window]


@dataclass
class ChunkBatch:
    """A step's prefill chunks as one call of a kernel that takes them all reads them: each
    chunk's block table (rows padded with block 0, past what its context reaches), context
    length, first row (counted from the first chunk's) and length."""

    block_tables: Tensor  # [chunks, widest table]
    context_lens: Tensor  # [chunks]
    starts: Tensor  # [chunks]
    lengths: Tensor  # [chunks]

    @classmethod
    def of(cls, chunks: list[PrefillChunk]) -> ChunkBatch:
        first = chunks[0].start
        tables = torch.zeros((len(chunks), max(len(c.block_table) for c in chunks)),
                             dtype=torch.long)
        for row, chunk in enumerate(chunks):
            tables[row, :len(chunk.block_table)] = chunk.block_table
        return cls(tables, torch.tensor([c.context_len for c in chunks], dtype=torch.long),
                   torch.tensor([c.start - first for c in chunks], dtype=torch.long),
                   torch.tensor([c.length for c in chunks], dtype=torch.long))


@dataclass
class StepMetadata:
    slot_mapping: Tensor  # [num_tokens]: block * BLOCK_SIZE + offset, where each new K/V goes
    num_single: int  # rows [0, num_single) are one-token sequences
    single_block_tables: Tensor  # [num_single, max_blocks], padded with the dummy block
    single_context_lens: Tensor  # [num_single]
    chunks: list[PrefillChunk]
    # [num_single, 1, 1, max_blocks * BLOCK_SIZE]: 0 where a query may attend, -inf elsewhere;
    # only for backends that gather and mask (SDPA would rebuild a boolean mask every call).
    single_mask: Tensor | None = None
    mask_dtype: torch.dtype = torch.float32
    single_window_masks: dict[int, Tensor] = field(default_factory=dict)
    # The chunks for a kernel that attends them all in one call; set by backends that have one.
    chunk_batch: ChunkBatch | None = None

    def single_window_mask(self, window: int) -> Tensor:
        """single_mask for a sliding-window layer: only the last `window` keys of each
        sequence (its new token's and the window - 1 before it)."""
        if window not in self.single_window_masks:
            lengths = self.single_context_lens
            key_pos = torch.arange(self.single_block_tables.shape[1] * BLOCK_SIZE,
                                   device=lengths.device)
            allowed = (key_pos[None, :] < lengths[:, None]) & (
                key_pos[None, :] >= lengths[:, None] - window)
            self.single_window_masks[window] = additive_mask(
                allowed, self.mask_dtype)[:, None, None, :]
        return self.single_window_masks[window]

    @classmethod
    def build(cls, single: list[tuple[list[int], int]], chunks: list[tuple[list[int], int, int]],
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
              with_single_mask: bool = True) -> StepMetadata:
        """single: (block_table, context_len) per one-token sequence; chunks: (block_table,
        context_len, length) per multi-token chunk, in that order in the flat batch."""
        slots = [slot(table, context_len - 1) for table, context_len in single]
        prefill_chunks = []
        start = len(single)
        for table, context_len, length in chunks:
            first = context_len - length
            slots.extend(slot(table, p) for p in range(first, context_len))
            prefill_chunks.append(PrefillChunk(
                start, length, context_len,
                torch.tensor(table[:-(-context_len // BLOCK_SIZE)], dtype=torch.long,
                             device=device), dtype))
            start += length

        width = max((len(t) for t, _ in single), default=0)
        tables = torch.zeros((len(single), width), dtype=torch.long)
        for row, (table, _) in enumerate(single):
            tables[row, :len(table)] = torch.tensor(table, dtype=torch.long)
        lengths = torch.tensor([n for _, n in single], dtype=torch.long, device=device)
        mask = None
        if with_single_mask:
            key_pos = torch.arange(width * BLOCK_SIZE, device=device)
            mask = additive_mask(key_pos[None, :] < lengths[:, None], dtype)[:, None, None, :]
        return cls(torch.tensor(slots, dtype=torch.long, device=device), len(single),
                   tables.to(device), lengths, prefill_chunks, mask, dtype)


def chunk_mask(first: int, context_len: int, device: torch.device | str,
               dtype: torch.dtype) -> Tensor:
    """The query at position first + i sees keys 0 .. first + i."""
    keys = torch.arange(context_len, device=device)
    queries = torch.arange(first, context_len, device=device)
    return additive_mask(keys[None, :] <= queries[:, None], dtype)
