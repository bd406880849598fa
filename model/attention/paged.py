"""Attention over the paged KV cache, for one engine step (layout: see metadata.py).

Per layer, the new K/V are written once into their slots; then

- single-token sequences attend together: their block tables are padded with the
  dummy block to one width, K/V gathered in one `index_select` each, and slots past
  each sequence's length masked out;
- each multi-token chunk attends causally over its sequence's cached K/V plus its own.

A sliding-window layer (a `window` from the model) masks every key older than its window,
in both paths, and a chunk gathers only the blocks its window reaches. Each layer reads
the step metadata of its KV cache group (kvcache/groups.py): in a sliding group, the
blocks before the window may have been given back and be the dummy block in its tables,
which the window's mask (or the kernels' first key) never reaches.

Query heads are grouped onto their shared K/V head by SDPA's `enable_gqa`, so K/V are
never repeated. `CpuKernelAttention` replaces the gather with compiled kernels that read
K/V in place through the block tables: one for the single-token rows
(model/kernels/csrc/paged_attention_cpu.cpp), one for the multi-token chunks
(model/kernels/csrc/paged_prefill_attention_cpu.cpp); the gather path stays as the reference, for
other devices and dtypes, and for bf16 chunks with much work on a CPU with AMX, where SDPA
runs on AMX and is the faster.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kvcache.pool import BLOCK_SIZE, KVCachePool
from model.attention.metadata import ChunkBatch, PrefillChunk, StepMetadata


class TorchPagedAttention:
    """The `attention` callable the model gets during an engine step: gather + SDPA."""

    name = "torch"

    def __init__(self, pool: KVCachePool) -> None:
        self.pool = pool
        self.layer_group = pool.layer_group
        self.steps: list[StepMetadata] = []  # per KV cache group; set for each model run

    @property
    def step(self) -> StepMetadata | None:
        """The first group's metadata: the only one for a pool of one group."""
        return self.steps[0] if self.steps else None

    @step.setter
    def step(self, step: StepMetadata | None) -> None:
        self.steps = [] if step is None else [step]

    def build_metadata(self, single: list[tuple[list[int], int]],
                       chunks: list[tuple[list[int], int, int]]) -> StepMetadata:
        device, dtype = self.pool.k[0].device, self.pool.k[0].dtype
        return StepMetadata.build(single, chunks, device, dtype, with_single_mask=True)

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor,
                 window: int | None = None) -> Tensor:
        assert self.steps, "set .steps (or .step) before running the model"
        step = self.steps[self.layer_group[layer_idx]]
        k_cache, v_cache = self.pool.k[layer_idx], self.pool.v[layer_idx]
        self.write(k_cache, v_cache, k, v, step)
        outputs = []
        if step.num_single:
            outputs.append(self.attend_single(q[:step.num_single], k_cache, v_cache, step,
                                              window))
        if step.chunks:
            outputs.extend(self.attend_chunks(q, k, v, k_cache, v_cache, step, window))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def attend_chunks(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                      step: StepMetadata, window: int | None = None) -> list[Tensor]:
        """Every prefill chunk of the step, one after another: their outputs in row order."""
        outputs = []
        for chunk in step.chunks:
            rows = slice(chunk.start, chunk.start + chunk.length)
            outputs.append(self.attend_chunk(q[rows], k[rows], v[rows], k_cache, v_cache, chunk,
                                             window))
        return outputs

    @staticmethod
    def write(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, step: StepMetadata) -> None:
        """Store this step's K/V in their slots, once; they are never moved again."""
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, step.slot_mapping, k)
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, step.slot_mapping, v)

    def attend_single(self, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                      step: StepMetadata, window: int | None = None) -> Tensor:
        keys, values = self.gather_single(k_cache, v_cache, step)
        mask = step.single_mask if window is None else step.single_window_mask(window)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values,
                                             attn_mask=mask, enable_gqa=True)
        return out.squeeze(2)  # [batch, heads, head_dim]

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
    def attend_chunk(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                     chunk: PrefillChunk, window: int | None = None) -> Tensor:
        """A chunk over its cached K/V and its own; a sliding-window layer gathers only the
        blocks from the first one its window reaches."""
        first_block, mask = 0, chunk.mask
        if window is not None:
            first_block, mask = chunk.window_keys(window, q.dtype)
        if chunk.mask is None:  # nothing before this chunk: attend over its own K/V
            keys, values = k, v
        else:
            table = chunk.block_table[first_block:]
            length = chunk.context_len - first_block * BLOCK_SIZE
            keys = k_cache.index_select(0, table).flatten(0, 1)[:length]
            values = v_cache.index_select(0, table).flatten(0, 1)[:length]
        # As [1, heads, tokens, dim]: in 4-D, SDPA's CPU flash kernel maps query heads onto
        # their K/V head itself; in 3-D it falls back to copying K/V once per query head.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return out[0].transpose(0, 1)


# Where torch's SDPA runs bf16 on AMX (oneDNN's tile matmuls), it beats the prefill kernel,
# whose arithmetic is fp32 FMAs, on chunks of at least this many rows that see at least
# this many (query, key) pairs; on smaller ones the kernel is faster (Intel Xeon, family 6
# model 167: benchmarks/studies/prefill_attention_microbench.py, docs/performance.md).
AMX_SDPA_MIN_ROWS = 16
AMX_SDPA_MIN_PAIRS = 8192


class CpuKernelAttention(TorchPagedAttention):
    """Single-token rows and prefill chunks through the compiled kernels, which read K/V in
    place; without a prefill kernel, chunks take the gather + SDPA path. With
    `amx_sdpa`, bf16 chunks with enough work take gather + SDPA too (see
    `chunk_takes_sdpa`)."""

    name = "cpu-kernel"

    def __init__(self, pool: KVCachePool, kernel: Callable,
                 prefill_kernel: Callable | None = None, amx_sdpa: bool = False,
                 chunks_kernel: Callable | None = None) -> None:
        super().__init__(pool)
        self.kernel = kernel
        self.prefill_kernel = prefill_kernel
        self.amx_sdpa = amx_sdpa
        self.chunks_kernel = chunks_kernel  # several chunks in one call (else one by one)

    def chunk_takes_sdpa(self, chunk: PrefillChunk) -> bool:
        """Whether this chunk goes to gather + SDPA rather than the prefill kernel: always
        without the kernel; with `amx_sdpa`, when it has at least AMX_SDPA_MIN_ROWS rows and
        they see at least AMX_SDPA_MIN_PAIRS keys in all (counted as if without a window)."""
        if self.prefill_kernel is None:
            return True
        n = chunk.length
        pairs = n * (chunk.context_len - n) + n * (n + 1) // 2
        return self.amx_sdpa and n >= AMX_SDPA_MIN_ROWS and pairs >= AMX_SDPA_MIN_PAIRS

    def build_metadata(self, single: list[tuple[list[int], int]],
                       chunks: list[tuple[list[int], int, int]]) -> StepMetadata:
        device, dtype = self.pool.k[0].device, self.pool.k[0].dtype
        step = StepMetadata.build(single, chunks, device, dtype, with_single_mask=False)
        if (self.chunks_kernel is not None and len(step.chunks) > 1
                and not any(self.chunk_takes_sdpa(c) for c in step.chunks)):
            step.chunk_batch = ChunkBatch.of(step.chunks)
        return step

    def attend_single(self, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                      step: StepMetadata, window: int | None = None) -> Tensor:
        return self.kernel(q.contiguous(), k_cache, v_cache, step.single_block_tables,
                           step.single_context_lens, q.shape[-1] ** -0.5, window or 0)

    def attend_chunks(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                      step: StepMetadata, window: int | None = None) -> list[Tensor]:
        """Several chunks that all take the kernel: one call, whose tasks (every chunk's)
        share the threads (`ChunkBatch`, set by build_metadata); else one chunk at a time."""
        batch = step.chunk_batch
        if batch is None:
            return super().attend_chunks(q, k, v, k_cache, v_cache, step, window)
        rows = q[step.chunks[0].start:step.chunks[-1].start + step.chunks[-1].length]
        return [self.chunks_kernel(rows.contiguous(), k_cache, v_cache, batch.block_tables,
                                   batch.context_lens, batch.starts, batch.lengths,
                                   q.shape[-1] ** -0.5, window or 0)]

    def attend_chunk(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                     chunk: PrefillChunk, window: int | None = None) -> Tensor:
        """The chunk's rows over every key up to theirs, cached or new (its own K/V are
        already in the pool), read through its block table: no gather, no mask; unless
        `chunk_takes_sdpa`, then gather + SDPA."""
        if self.chunk_takes_sdpa(chunk):
            return super().attend_chunk(q, k, v, k_cache, v_cache, chunk, window)
        return self.prefill_kernel(q.contiguous(), k_cache, v_cache, chunk.block_table,
                                   chunk.context_len, q.shape[-1] ** -0.5, window or 0)
