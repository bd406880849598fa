"""Block bookkeeping: reference counts, the prefix-cache index, and the free lists.

Knows block ids, counts and hashes; nothing of requests or tensors. Every block
other than the dummy is in exactly one of three states:

    used         ref_count > 0 (held by one or more sequences)
    cached-free  ref_count == 0 but holds a full block findable by its hash;
                 kept in least-recently-freed order, revived on a hit,
                 evicted (oldest first) only when a fresh block is needed
    free         ref_count == 0 and holds nothing worth finding

With KV cache groups (groups.py), every group draws from this one pool; a cached block is
findable by its hash within the group whose layers it holds (the same tokens sit in one
block per group).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvcache.pool import DUMMY_BLOCK


class OutOfBlocksError(RuntimeError):
    """No free block is left in the KV cache pool."""


def hash_block(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """A full block's identity: its own tokens and, through the parent's hash, everything
    before it. BLAKE2b-128 rather than Python's hash(): a crafted prompt must not be able to
    collide with another user's prefix and be served its K/V."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update((parent_hash or 0).to_bytes(16, "little"))
    digest.update(array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little")


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # What the hash stands for, kept to guard against hash collisions on lookup.
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    group: int = 0  # the KV cache group it was cached for


class BlockAllocator:
    def __init__(self, num_blocks: int, enable_prefix_cache: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_prefix_cache = enable_prefix_cache
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(i for i in range(num_blocks) if i != DUMMY_BLOCK)
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._by_hash: dict[tuple[int, int], int] = {}  # (group, hash) -> block
        self.num_used = 0

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1  # all but the dummy

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (evicting cached ones if needed)."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached_free(self) -> int:
        return len(self._cached_free)

    def cached_free_ids(self) -> tuple[int, ...]:
        """The cached-free blocks, the next to be evicted first."""
        return tuple(self._cached_free)

    def block_for_hash(self, block_hash: int, group: int = 0) -> int | None:
        """The block findable by this hash, if any (for display: no token comparison)."""
        return self._by_hash.get((group, block_hash))

    def allocate(self) -> int:
        """A block for fresh content, ref_count 1. Evicts the oldest cached-free block if no
        plain free block is left."""
        if self._free:
            block_id = self._free.popleft()
        elif self._cached_free:
            block_id, _ = self._cached_free.popitem(last=False)
            self._forget(self.blocks[block_id])
        else:
            raise OutOfBlocksError(f"all {self.num_usable} KV cache blocks are in use")
        self.blocks[block_id].ref_count = 1
        self.num_used += 1
        return block_id

    def acquire(self, block_id: int) -> None:
        """One more holder of a block that is cached (shared prefix); revives it if free."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            if block_id not in self._cached_free:
                raise ValueError(f"block {block_id} is free and holds nothing to share")
            del self._cached_free[block_id]
            self.num_used += 1
        block.ref_count += 1

    def free(self, block_id: int) -> None:
        """One holder fewer; at zero the block becomes cached-free (if findable) or free."""
        block = self.blocks[block_id]
        if block_id == DUMMY_BLOCK or block.ref_count <= 0:
            raise ValueError(f"block {block_id} is not in use")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.num_used -= 1
            if block.block_hash is not None:
                self._cached_free[block_id] = None  # most recently freed: evicted last
            else:
                self._free.append(block_id)

    def lookup(self, block_hash: int, parent_hash: int | None,
               token_ids: Sequence[int], group: int = 0) -> int | None:
        """The block holding exactly these tokens after this parent, if one is cached."""
        block_id = self._by_hash.get((group, block_hash))
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.parent_hash != parent_hash or block.token_ids != tuple(token_ids):
            return None  # a hash collision, not a hit
        return block_id

    def cache(self, block_id: int, block_hash: int, parent_hash: int | None,
              token_ids: Sequence[int], group: int = 0) -> None:
        """Make a full, computed, in-use block of this group findable by later sequences."""
        if not self.enable_prefix_cache or (group, block_hash) in self._by_hash:
            return  # off, or the same content already sits in another block
        block = self.blocks[block_id]
        assert block.ref_count > 0 and block.block_hash is None
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, tuple(
            token_ids)
        block.group = group
        self._by_hash[(group, block_hash)] = block_id

    def _forget(self, block: Block) -> None:
        assert block.block_hash is not None
        del self._by_hash[(block.group, block.block_hash)]
        block.block_hash, block.parent_hash, block.token_ids = None, None, ()

    def check_invariants(self) -> None:
        """free + used + cached-free == all usable blocks, and the lists agree with counts."""
        assert len(self._free) + self.num_used + len(self._cached_free) == self.num_usable
        used = sum(1 for b in self.blocks if b.ref_count > 0)
        assert used == self.num_used, (used, self.num_used)
        assert all(self.blocks[i].ref_count == 0 for i in self._free)
        assert all(self.blocks[i].ref_count == 0 and self.blocks[i].block_hash is not None
                   for i in self._cached_free)
        assert set(self._free).isdisjoint(self._cached_free)
        assert DUMMY_BLOCK not in self._free and DUMMY_BLOCK not in self._cached_free
