"""Engine snapshots (engine/snapshot.py) turned into what the page reads: one JSON frame per
snapshot for the event stream, and one block's details (with its token text) for a tooltip.

All of it runs on the API side: the engine thread only copied counts and ids.
"""

from __future__ import annotations

import json
import time
from typing import Any

from engine.snapshot import EngineSnapshot
from kvcache.block_allocator import BlockAllocator

# The /metrics counters the page charts, by sample name (summed over labels).
COUNTERS = {
    "nano_vllm:generation_tokens_total": "generation_tokens",
    "nano_vllm:prompt_tokens_total": "prompt_tokens",
    "nano_vllm:prefix_cache_queries_total": "prefix_queries",
    "nano_vllm:prefix_cache_hits_total": "prefix_hits",
    "nano_vllm:num_preemptions_total": "preemptions",
    "nano_vllm:request_success_total": "finished",
    "nano_vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "nano_vllm:time_to_first_token_seconds_count": "ttft_count",
    "nano_vllm:inter_token_latency_seconds_sum": "itl_sum",
    "nano_vllm:inter_token_latency_seconds_count": "itl_count",
}


def short_hash(block_hash: int | None) -> str | None:
    """The first 12 hex digits: plenty to tell blocks apart on a page."""
    return None if block_hash is None else f"{block_hash:032x}"[:12]


def counter_totals(metrics: Any) -> dict[str, float]:
    """The counters above, read from the same metric objects /metrics renders (only these:
    collecting the whole registry would also compute every gauge)."""
    totals = dict.fromkeys(COUNTERS.values(), 0.0)
    for metric in (metrics.generation_tokens, metrics.prompt_tokens, metrics.prefix_cache_queries,
                   metrics.prefix_cache_hits, metrics.preemptions, metrics.request_success,
                   metrics.ttft, metrics.itl):
        for family in metric.collect():
            for sample in family.samples:
                key = COUNTERS.get(sample.name)
                if key is not None:
                    totals[key] += sample.value
    return totals


def snapshot_frame(snapshot: EngineSnapshot) -> dict[str, Any]:
    """Everything the page draws from one snapshot, in compact lists."""
    refs, owners = snapshot.grid()
    return {
        "seq": snapshot.seq,
        "step": snapshot.step,
        "num_blocks": snapshot.num_blocks,
        "block_size": snapshot.block_size,
        "token_budget": snapshot.token_budget,
        "max_num_seqs": snapshot.max_num_seqs,
        "refs": refs,
        "owners": owners,
        "cached_free": len(snapshot.cached_free),
        "requests": [{
            "id": r.request_id, "status": r.status, "prompt": r.num_prompt_tokens,
            "cached": r.num_cached_tokens, "computed": r.num_computed_tokens,
            "output": r.num_output_tokens, "max_tokens": r.max_tokens,
            "preemptions": r.num_preemptions, "blocks": len(r.block_table),
            "shared_blocks": sum(1 for b in r.block_table if refs[b] > 1),
        } for r in snapshot.requests],
        "steps": [[s.step, s.prefill_tokens, s.decode_tokens, round(s.duration_ms, 2),
                   s.running, s.waiting, s.preempted] for s in snapshot.steps],
    }


class FrameCache:
    """One serialized frame per snapshot, however many pages watch."""

    def __init__(self) -> None:
        self._seq: int | None = None
        self._json = ""

    def frame_json(self, snapshot: EngineSnapshot) -> str:
        if snapshot.seq != self._seq:
            self._json, self._seq = json.dumps(snapshot_frame(snapshot)), snapshot.seq
        return self._json


def event_data(frame_json: str, counters: dict[str, float]) -> str:
    """One SSE message: the frame plus the counters and the wall time they were read at."""
    return (f'{{"time": {time.time():.3f}, "counters": {json.dumps(counters)}, '
            f'"frame": {frame_json}}}')


def chain_depth(allocator: BlockAllocator, parent_hash: int | None, limit: int) -> int | None:
    """How many findable blocks come before one whose parent is `parent_hash` (None if the
    chain breaks: an ancestor was evicted)."""
    depth = 0
    while parent_hash is not None:
        parent = allocator.block_for_hash(parent_hash)
        if parent is None or depth >= limit:
            return None
        parent_hash, depth = allocator.blocks[parent].parent_hash, depth + 1
    return depth


def block_details(snapshot: EngineSnapshot, block_id: int, allocator: BlockAllocator | None,
                  tokenizer: Any) -> dict[str, Any]:
    """A tooltip's worth: state, holders, place in the hash chain, token text. Raises
    IndexError for an id outside the pool.

    A used block's tokens come from its owner's copy in the snapshot. A cached-free block's
    come from the pool itself, read here on the API thread: a block's hash, parent and
    tokens are replaced together when it is cached or evicted, never edited, so the read
    is checked by reading its hash again."""
    view = snapshot.block(block_id)
    size = snapshot.block_size
    token_ids: tuple[int, ...] = ()
    position, block_hash, parent = view.position, view.block_hash, view.parent_hash
    if view.state == "used":
        owner = snapshot.request(view.owners[0])
        assert owner is not None and position is not None
        start = position * size
        token_ids = owner.token_ids[start:min(start + size, owner.num_computed_tokens)]
    elif view.state == "cached" and allocator is not None:
        block = allocator.blocks[block_id]
        block_hash, parent, token_ids = block.block_hash, block.parent_hash, block.token_ids
        if block.block_hash != block_hash or block_hash is None:  # evicted meanwhile
            block_hash, parent, token_ids = None, None, ()
        else:
            position = chain_depth(allocator, parent, snapshot.num_blocks)
    first = None if position is None else position * size
    return {
        "block_id": block_id,
        "state": view.state,
        "ref_count": view.ref_count,
        "owners": list(view.owners),
        "position": position,
        "token_range": None if first is None else [first, first + len(token_ids) - 1],
        "hash": short_hash(block_hash),
        "parent_hash": short_hash(parent),
        "token_ids": list(token_ids),
        "text": tokenizer.decode(list(token_ids)) if token_ids else "",
    }
