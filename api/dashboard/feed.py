"""Engine snapshots (engine/snapshot.py) turned into what the page reads: one JSON frame per
snapshot for the event stream, and one block's details (with its token text) for a tooltip.

All of it runs on the API side: the engine thread only copied counts and ids (and, for a
cached-free block's tooltip, read that block's record: engine/snapshot.py's CachedBlock).
"""

from __future__ import annotations

import json
import time
from typing import Any

from engine.snapshot import BlockView, CachedBlock, EngineSnapshot


def short_hash(block_hash: int | None) -> str | None:
    """The first 12 hex digits: plenty to tell blocks apart on a page."""
    return None if block_hash is None else f"{block_hash:032x}"[:12]


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
        "group_windows": list(snapshot.group_windows),
        "group_size": snapshot.group_size,
        "refs": refs,
        "owners": owners,
        "cached_free": len(snapshot.cached_free),
        "requests": [{
            "id": r.request_id, "status": r.status, "prompt": r.num_prompt_tokens,
            "cached": r.num_cached_tokens, "computed": r.num_computed_tokens,
            "output": r.num_output_tokens, "max_tokens": r.max_tokens,
            "preemptions": r.num_preemptions, "blocks": len(r.held()),
            "shared_blocks": sum(1 for b in r.held() if refs[b] > 1),
            "left_behind": r.num_left_behind,
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


def block_details(snapshot: EngineSnapshot, view: BlockView, cached: CachedBlock | None,
                  tokenizer: Any) -> dict[str, Any]:
    """A tooltip's worth: state, holders, place in the hash chain, token text. `view` is
    `snapshot.block(id)`; `cached` the engine's record of it if it is cached-free (None
    otherwise, or if it was evicted since the snapshot).

    A used block's tokens come from its owner's copy in the snapshot."""
    size = snapshot.block_size
    token_ids: tuple[int, ...] = ()
    position, block_hash, parent = view.position, view.block_hash, view.parent_hash
    if view.state == "used":
        owner = snapshot.request(view.owners[0])
        assert owner is not None and position is not None
        start = position * size
        token_ids = owner.token_ids[start:min(start + size, owner.num_computed_tokens)]
    elif cached is not None:
        block_hash, parent, token_ids = cached.block_hash, cached.parent_hash, cached.token_ids
        position = cached.position
    first = None if position is None else position * size
    return {
        "block_id": view.block_id,
        "state": view.state,
        "ref_count": view.ref_count,
        "owners": list(view.owners),
        "position": position,
        "group": view.group,
        "token_range": None if first is None else [first, first + len(token_ids) - 1],
        "hash": short_hash(block_hash),
        "parent_hash": short_hash(parent),
        "token_ids": list(token_ids),
        "text": tokenizer.decode(list(token_ids)) if token_ids else "",
    }
