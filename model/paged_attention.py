"""Attention over the paged KV cache, for one engine step.

A step's tokens are laid out flat: first the single-token sequences (decodes,
and prefills with one token left to compute), then the multi-token chunks
(prefills). Per layer, the new K/V are written once into their slots; then

- single-token sequences attend together: their block tables are padded with
  the dummy block to one width, K/V gathered in one `index_select` each, and
  slots past each sequence's length masked out;
- each multi-token chunk attends causally over its sequence's cached K/V plus
  its own.

Query heads are grouped onto their shared K/V head by SDPA's `enable_gqa`, so K/V
are never repeated.

On a CPU in fp32, the one-token sequences can instead go through a compiled kernel
(model/csrc/paged_attention_cpu.cpp) that reads K/V in place through the block
tables: no gather, no padding. The gather path stays as the reference and for
other devices and dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kvcache.pool import BLOCK_SIZE, KVCachePool


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where allowed, -inf elsewhere. Masked scores become exactly -inf, so whatever sits
    in an unused or stale slot gets softmax weight 0 (as long as it is finite)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf"))


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the flat batch
    length: int  # tokens computed now
    context_len: int  # tokens of the sequence after this chunk (cached + new)
    block_table: Tensor  # [blocks covering context_len]
    mask: Tensor | None  # [length, context_len]: 0 = may attend, -inf = not; None = causal


@dataclass
class StepMetadata:
    slot_mapping: Tensor  # [num_tokens]: block * BLOCK_SIZE + offset, where each new K/V goes
    num_single: int  # rows [0, num_single) are one-token sequences
    single_block_tables: Tensor  # [num_single, max_blocks], padded with the dummy block
    # [num_single, 1, 1, max_blocks * BLOCK_SIZE]: 0 where a query may attend, -inf elsewhere.
    # Additive and built once per step: SDPA turns a boolean mask into this on every call.
    single_mask: Tensor
    single_context_lens: Tensor  # [num_single]
    chunks: list[PrefillChunk]

    @classmethod
    def build(cls, single: list[tuple[list[int], int]], chunks: list[tuple[list[int], int, int]],
              device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> StepMetadata:
        """single: (block_table, context_len) per one-token sequence; chunks: (block_table,
        context_len, length) per multi-token chunk, in that order in the flat batch."""
        slots: list[int] = []
        for table, context_len in single:
            pos = context_len - 1
            slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        prefill_chunks = []
        start = len(single)
        for table, context_len, length in chunks:
            first = context_len - length
            slots.extend(table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                         for p in range(first, context_len))
            if first == 0:
                mask = None
            else:  # query at position first + i sees keys 0 .. first + i
                keys = torch.arange(context_len, device=device)
                queries = torch.arange(first, context_len, device=device)
                mask = additive_mask(keys[None, :] <= queries[:, None], dtype)
            used = -(-context_len // BLOCK_SIZE)
            prefill_chunks.append(PrefillChunk(
                start, length, context_len,
                torch.tensor(table[:used], dtype=torch.long, device=device), mask))
            start += length

        width = max((len(t) for t, _ in single), default=0)
        tables = torch.zeros((len(single), width), dtype=torch.long, device=device)
        for row, (table, _) in enumerate(single):
            tables[row, :len(table)] = torch.tensor(table, dtype=torch.long)
        lengths = torch.tensor([n for _, n in single], dtype=torch.long, device=device)
        key_pos = torch.arange(width * BLOCK_SIZE, device=device)
        single_mask = additive_mask(key_pos[None, :] < lengths[:, None], dtype)[:, None, None, :]
        return cls(torch.tensor(slots, dtype=torch.long, device=device), len(single),
                   tables, single_mask, lengths, prefill_chunks)


class PagedAttention:
    """The `attention` callable the model gets during an engine step."""

    def __init__(self, pool: KVCachePool, decode_kernel: Callable | None = None) -> None:
        self.pool = pool
        self.decode_kernel = decode_kernel  # see model/cpu_kernel.py; None = gather + SDPA
        self.step: StepMetadata | None = None

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        step = self.step
        assert step is not None, "set .step before running the model"
        k_cache, v_cache = self.pool.k[layer_idx], self.pool.v[layer_idx]
        self.write(k_cache, v_cache, k, v, step)
        outputs = []
        if step.num_single and self.decode_kernel is not None:
            outputs.append(self.decode_kernel(
                q[:step.num_single].contiguous(), k_cache, v_cache, step.single_block_tables,
                step.single_context_lens, q.shape[-1] ** -0.5))
        elif step.num_single:
            keys, values = self.gather_single(k_cache, v_cache, step)
            outputs.append(self.attend_single(q[:step.num_single], keys, values, step))
        for chunk in step.chunks:
            rows = slice(chunk.start, chunk.start + chunk.length)
            outputs.append(self.attend_chunk(q[rows], k[rows], v[rows], k_cache, v_cache, chunk))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    @staticmethod
    def write(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, step: StepMetadata) -> None:
        """Store this step's K/V in their slots, once; they are never moved again."""
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, step.slot_mapping, k)
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, step.slot_mapping, v)

    @staticmethod
    def gather_single(k_cache: Tensor, v_cache: Tensor,
                      step: StepMetadata) -> tuple[Tensor, Tensor]:
        """K and V of every one-token sequence through its block table, one gather each:
        [batch, kv_heads, width * BLOCK_SIZE, head_dim]."""
        batch, width = step.single_block_tables.shape
        flat_tables = step.single_block_tables.flatten()
        shape = (batch, width * BLOCK_SIZE, *k_cache.shape[2:])
        keys = k_cache.index_select(0, flat_tables).view(shape).transpose(1, 2)
        values = v_cache.index_select(0, flat_tables).view(shape).transpose(1, 2)
        return keys, values

    @staticmethod
    def attend_single(q: Tensor, keys: Tensor, values: Tensor, step: StepMetadata) -> Tensor:
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values,
                                             attn_mask=step.single_mask, enable_gqa=True)
        return out.squeeze(2)  # [batch, heads, head_dim]

    @staticmethod
    def attend_chunk(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                     chunk: PrefillChunk) -> Tensor:
        if chunk.mask is None:  # nothing before this chunk: attend over its own K/V
            keys, values = k, v
        else:
            keys = k_cache.index_select(0, chunk.block_table).flatten(0, 1)[:chunk.context_len]
            values = v_cache.index_select(0, chunk.block_table).flatten(0, 1)[:chunk.context_len]
        # As [1, heads, tokens, dim]: in 4-D, SDPA's CPU flash kernel maps query heads onto
        # their K/V head itself; in 3-D it falls back to copying K/V once per query head.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=chunk.mask, is_causal=chunk.mask is None, enable_gqa=True)
        return out[0].transpose(0, 1)
