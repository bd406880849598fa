"""Which blocks a sequence holds: prefix hits, growth as it gets longer, release.

A sequence's blocks are a `SequenceBlocks`: its block table, plus the hash chain
of its leading full blocks that are already findable in the prefix cache.

Samples of one prompt share its blocks (`fork`: one more reference each). Full blocks are
never written again, so sharing them is free; the last, partly filled block is copied
(copy-on-write) when a sample first writes into it while others still hold it. The copies
`allocate_slots` decides are queued in `block_copies` until the step that runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcache.block_allocator import BlockAllocator, hash_block
from kvcache.pool import BLOCK_SIZE


def blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


@dataclass
class SequenceBlocks:
    block_table: list[int] = field(default_factory=list)
    # hashes[i] identifies block_table[i], for each leading full block whose K/V is computed.
    hashes: list[int] = field(default_factory=list)


class KVCacheManager:
    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self.block_copies: list[tuple[int, int]] = []  # (source, destination), not yet done

    def fork(self, blocks: SequenceBlocks) -> SequenceBlocks:
        """A second holder of the same blocks (a sample of the same prompt)."""
        for block_id in blocks.block_table:
            self.allocator.acquire(block_id)
        return SequenceBlocks(list(blocks.block_table), list(blocks.hashes))

    def take_block_copies(self) -> list[tuple[int, int]]:
        """The copies to run before the next forward pass; the queue is emptied."""
        copies, self.block_copies = self.block_copies, []
        return copies

    def find_cached_prefix(self, token_ids: Sequence[int]) -> SequenceBlocks:
        """The longest run of leading full blocks already in the cache (nothing is acquired).

        The last token is never taken from the cache: its logits are needed, so at least it
        is computed again."""
        found = SequenceBlocks()
        if not self.allocator.enable_prefix_cache:
            return found
        parent = None
        for i in range((len(token_ids) - 1) // BLOCK_SIZE):
            chunk = token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
            block_hash = hash_block(parent, chunk)
            block_id = self.allocator.lookup(block_hash, parent, chunk)
            if block_id is None:
                break
            found.block_table.append(block_id)
            found.hashes.append(block_hash)
            parent = block_hash
        return found

    def allocate_slots(self, blocks: SequenceBlocks, num_tokens: int,
                       new_prefix_hit: bool = False, write_from: int | None = None) -> bool:
        """Make `blocks` hold num_tokens, taking fresh blocks as needed; all or nothing.

        With new_prefix_hit, `blocks` is what find_cached_prefix just returned: its blocks
        are acquired (revived if cached-free) as part of the same all-or-nothing step.
        With write_from (the first position the next step writes), a block there that others
        share is replaced by a private copy (queued in block_copies).
        Returns False, and changes nothing, if the pool cannot supply enough blocks."""
        new = blocks_for(num_tokens) - len(blocks.block_table)
        # A hit on a cached-free block revives it, which uses up one free block.
        revived = sum(1 for b in blocks.block_table
                      if self.allocator.blocks[b].ref_count == 0) if new_prefix_hit else 0
        shared = self._shared_block_at(blocks, write_from)
        if self.allocator.num_free - revived < max(new, 0) + (shared is not None):
            return False
        if new_prefix_hit:
            for block_id in blocks.block_table:
                self.allocator.acquire(block_id)
        if shared is not None:
            source, copy = blocks.block_table[shared], self.allocator.allocate()
            self.allocator.free(source)  # one holder fewer; the others keep it
            blocks.block_table[shared] = copy
            self.block_copies.append((source, copy))
        for _ in range(new):
            blocks.block_table.append(self.allocator.allocate())
        return True

    def _shared_block_at(self, blocks: SequenceBlocks, position: int | None) -> int | None:
        """The index in the block table of the block holding `position`, if others hold it
        too (only ever a partly filled block: full ones are never written again)."""
        if position is None:
            return None
        index = position // BLOCK_SIZE
        if index >= len(blocks.block_table):
            return None
        if self.allocator.blocks[blocks.block_table[index]].ref_count <= 1:
            return None
        assert index >= len(blocks.hashes), "a full, cached block is never written"
        return index

    def cache_full_blocks(self, blocks: SequenceBlocks, token_ids: Sequence[int],
                          num_computed: int) -> None:
        """Make every full block whose K/V is now computed findable by later sequences."""
        parent = blocks.hashes[-1] if blocks.hashes else None
        for i in range(len(blocks.hashes), num_computed // BLOCK_SIZE):
            chunk = token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
            block_hash = hash_block(parent, chunk)
            self.allocator.cache(blocks.block_table[i], block_hash, parent, chunk)
            blocks.hashes.append(block_hash)
            parent = block_hash

    def free_blocks_after(self, blocks: SequenceBlocks, num_tokens: int) -> None:
        """Give back the blocks past the first num_tokens tokens' (taken for drafted tokens
        that were then rejected). They were never full of computed tokens, so never cached."""
        keep = blocks_for(num_tokens)
        assert keep >= len(blocks.hashes)
        for block_id in reversed(blocks.block_table[keep:]):
            self.allocator.free(block_id)
        del blocks.block_table[keep:]

    def release(self, blocks: SequenceBlocks) -> None:
        """Give back every block; the tail first, so it is also evicted first (a prefix's
        early blocks are the ones other sequences are most likely to share)."""
        for block_id in reversed(blocks.block_table):
            self.allocator.free(block_id)
        released = set(blocks.block_table)  # a copy into a block let go of is moot
        self.block_copies = [(s, d) for s, d in self.block_copies if d not in released]
        blocks.block_table.clear()
        blocks.hashes.clear()
