"""Which blocks a sequence holds: prefix hits, growth as it gets longer, release.

A sequence's blocks are a `SequenceBlocks`: one block table per KV cache group (groups.py;
one table for a model without sliding windows), plus the hash chain of its leading full
blocks that are already findable in the prefix cache.

In a sliding-window group, a block that no query still to come can see (every key in it
is older than the window of the next position to compute) is given back while the
sequence runs (`free_left_behind`); its table entry becomes the dummy block, so positions
stay where they were and the attention kernels, which start at the window, never read it.
A full block given back stays findable in the prefix cache until evicted. A prefix hit is
the longest prefix for which every full-attention group has all its blocks and every
sliding group has the blocks its window reaches from the hit's end.

Samples of one prompt share its blocks (`fork`: one more reference each). Full blocks are
never written again, so sharing them is free; the last, partly filled block is copied
(copy-on-write) when a sample first writes into it while others still hold it. A sequence
that shares only the first tokens of a block with a seated one (a system prompt that ends
inside a block) starts from a copy of that block (`partial_from`), rather than compute those
tokens again. The copies `allocate_slots` decides are queued in `block_copies` until the
step that runs them, before its forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcache.block_allocator import BlockAllocator, hash_block
from kvcache.groups import KVCacheGroups
from kvcache.pool import BLOCK_SIZE, DUMMY_BLOCK


def blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


def first_visible_block(num_computed: int, window: int) -> int:
    """The first block a query at position num_computed (or later) can see through a window:
    it sees keys num_computed - window + 1 .. num_computed."""
    return max(0, num_computed - window + 1) // BLOCK_SIZE


@dataclass
class SequenceBlocks:
    # Per KV cache group, entry i holds tokens 16i .. 16i+15 (the dummy where a sliding
    # group has given the block back).
    tables: list[list[int]] = field(default_factory=lambda: [[]])
    # hashes[i] identifies block i of every group, for each leading full block whose K/V
    # is computed.
    hashes: list[int] = field(default_factory=list)
    # Per group, how many leading entries are the dummy (given back, or never taken).
    left_behind: list[int] = field(default_factory=lambda: [0])

    @property
    def block_table(self) -> list[int]:
        """The first group's table: the only one for a model without sliding windows."""
        return self.tables[0]

    def held(self) -> list[int]:
        """Every block it holds, in all groups."""
        return [b for table in self.tables for b in table if b != DUMMY_BLOCK]


class KVCacheManager:
    def __init__(self, allocator: BlockAllocator, groups: KVCacheGroups | None = None) -> None:
        self.allocator = allocator
        self.windows: tuple[int | None, ...] = groups.windows if groups else (None,)
        self.num_groups = len(self.windows)
        self.group_size = groups.group_size if groups else 0  # layers a group; 0: not known
        self.sliding = [(g, w) for g, w in enumerate(self.windows) if w is not None]
        self.block_copies: list[tuple[int, int]] = []  # (source, destination), not yet done

    def new_blocks(self) -> SequenceBlocks:
        return SequenceBlocks([[] for _ in self.windows], [], [0] * self.num_groups)

    def _tables(self, blocks: SequenceBlocks) -> list[list[int]]:
        """blocks' tables, one per group (an empty SequenceBlocks() gets them here)."""
        if len(blocks.tables) != self.num_groups:
            assert not any(blocks.tables), "a block table from another layout"
            blocks.tables = [[] for _ in self.windows]
            blocks.left_behind = [0] * self.num_groups
        return blocks.tables

    def fork(self, blocks: SequenceBlocks) -> SequenceBlocks:
        """A second holder of the same blocks (a sample of the same prompt)."""
        for block_id in blocks.held():
            self.allocator.acquire(block_id)
        return SequenceBlocks([list(t) for t in blocks.tables], list(blocks.hashes),
                              list(blocks.left_behind))

    def take_block_copies(self) -> list[tuple[int, int]]:
        """The copies to run before the next forward pass; the queue is emptied."""
        copies, self.block_copies = self.block_copies, []
        return copies

    def blocks_needed(self, blocks: SequenceBlocks, num_tokens: int) -> int:
        """Fresh blocks, over all groups, for `blocks` to hold num_tokens."""
        want = blocks_for(num_tokens)
        return sum(max(want - len(t), 0) for t in self._tables(blocks))

    def find_cached_prefix(self, token_ids: Sequence[int]) -> SequenceBlocks:
        """The longest run of leading full blocks every group has what it needs of
        (nothing is acquired): a full-attention group every block, a sliding group the
        blocks its window reaches from the end of the run.

        The last token is never taken from the cache: its logits are needed, so at least it
        is computed again."""
        found = self.new_blocks()
        if not self.allocator.enable_prefix_cache:
            return found
        hashes: list[int] = []
        ids: list[list[int | None]] = [[] for _ in self.windows]
        parent = None
        for i in range((len(token_ids) - 1) // BLOCK_SIZE):
            chunk = token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
            block_hash = hash_block(parent, chunk)
            row = [self.allocator.lookup(block_hash, parent, chunk, g)
                   for g in range(self.num_groups)]
            if all(b is None for b in row) or any(
                    b is None for b, w in zip(row, self.windows, strict=True) if w is None):
                break
            for g, block_id in enumerate(row):
                ids[g].append(block_id)
            hashes.append(block_hash)
            parent = block_hash
        hit = next((h for h in range(len(hashes), 0, -1) if all(
            None not in ids[g][first_visible_block(h * BLOCK_SIZE, w):h]
            for g, w in self.sliding)), 0)
        found.hashes = hashes[:hit]
        for g, window in enumerate(self.windows):
            first = 0 if window is None else first_visible_block(hit * BLOCK_SIZE, window)
            found.tables[g] = [DUMMY_BLOCK] * first + [b for b in ids[g][first:hit]
                                                       if b is not None]
            found.left_behind[g] = first
        return found

    def allocate_slots(self, blocks: SequenceBlocks, num_tokens: int,
                       new_prefix_hit: bool = False, write_from: int | None = None,
                       partial_from: SequenceBlocks | None = None) -> bool:
        """Make `blocks` hold num_tokens in every group, taking fresh blocks as needed; all
        or nothing.

        With new_prefix_hit, `blocks` is what find_cached_prefix just returned: its blocks
        are acquired (revived if cached-free) as part of the same all-or-nothing step.
        With write_from (the first position the next step writes), a block there that others
        share is replaced by a private copy (queued in block_copies), in each group.
        With partial_from (another sequence's blocks, whose K/V for the first tokens of the
        block after `blocks`' last are this sequence's too), the first fresh block of each
        group starts as a copy of that sequence's block there (queued in block_copies).
        Returns False, and changes nothing, if the pool cannot supply enough blocks."""
        tables = self._tables(blocks)
        want = blocks_for(num_tokens)
        new = sum(max(want - len(t), 0) for t in tables)
        # A hit on a cached-free block revives it, which uses up one free block.
        revived = sum(1 for b in blocks.held()
                      if self.allocator.blocks[b].ref_count == 0) if new_prefix_hit else 0
        shared = self._shared_blocks_at(blocks, write_from)
        if self.allocator.num_free - revived < new + len(shared):
            return False
        if new_prefix_hit:
            for block_id in blocks.held():
                self.allocator.acquire(block_id)
        for table, index in shared:
            source, copy = table[index], self.allocator.allocate()
            self.allocator.free(source)  # one holder fewer; the others keep it
            table[index] = copy
            self.block_copies.append((source, copy))
        for g, table in enumerate(tables):
            first_fresh = len(table)
            for _ in range(want - len(table)):
                table.append(self.allocator.allocate())
            if partial_from is not None:
                assert want > first_fresh, "a partial block is copied into a fresh one"
                source = partial_from.tables[g][first_fresh]
                assert source != DUMMY_BLOCK
                self.block_copies.append((source, table[first_fresh]))
        return True

    def _shared_blocks_at(self, blocks: SequenceBlocks,
                          position: int | None) -> list[tuple[list[int], int]]:
        """(table, index) of each group's block holding `position`, where others hold it
        too (only ever a partly filled block: full ones are never written again)."""
        if position is None:
            return []
        index = position // BLOCK_SIZE
        shared = []
        for table in blocks.tables:
            if index < len(table) and self.allocator.blocks[table[index]].ref_count > 1:
                assert index >= len(blocks.hashes), "a full, cached block is never written"
                shared.append((table, index))
        return shared

    def cache_full_blocks(self, blocks: SequenceBlocks, token_ids: Sequence[int],
                          num_computed: int) -> None:
        """Make every full block whose K/V is now computed findable by later sequences."""
        parent = blocks.hashes[-1] if blocks.hashes else None
        for i in range(len(blocks.hashes), num_computed // BLOCK_SIZE):
            chunk = token_ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
            block_hash = hash_block(parent, chunk)
            for g, table in enumerate(blocks.tables):
                if table[i] != DUMMY_BLOCK:
                    self.allocator.cache(table[i], block_hash, parent, chunk, g)
            blocks.hashes.append(block_hash)
            parent = block_hash

    def free_left_behind(self, blocks: SequenceBlocks, num_computed: int) -> None:
        """In each sliding-window group, give back the blocks no query from position
        num_computed on can see (full ones stay findable until evicted)."""
        if not self.sliding:
            return
        tables = self._tables(blocks)
        for g, window in self.sliding:
            table = tables[g]
            first = min(first_visible_block(num_computed, window), len(table))
            for i in range(blocks.left_behind[g], first):
                self.allocator.free(table[i])
                table[i] = DUMMY_BLOCK
            blocks.left_behind[g] = max(blocks.left_behind[g], first)

    def free_blocks_after(self, blocks: SequenceBlocks, num_tokens: int) -> None:
        """Give back the blocks past the first num_tokens tokens' (taken for drafted tokens
        that were then rejected), in every group. They were never full of computed tokens,
        so never cached."""
        keep = blocks_for(num_tokens)
        assert keep >= len(blocks.hashes)
        for table in blocks.tables:
            for block_id in reversed(table[keep:]):
                self.allocator.free(block_id)
            del table[keep:]

    def release(self, blocks: SequenceBlocks) -> None:
        """Give back every block; the tail first, so it is also evicted first (a prefix's
        early blocks are the ones other sequences are most likely to share)."""
        released = set()
        for i in range(max((len(t) for t in blocks.tables), default=0) - 1, -1, -1):
            for table in blocks.tables:
                if i < len(table) and table[i] != DUMMY_BLOCK:
                    self.allocator.free(table[i])
                    released.add(table[i])
        # A copy into a block let go of is moot.
        self.block_copies = [(s, d) for s, d in self.block_copies if d not in released]
        for table in blocks.tables:
            table.clear()
        blocks.hashes.clear()
        blocks.left_behind = [0] * len(blocks.tables)
