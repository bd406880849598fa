"""The allocator and prefix cache on a toy pool of a handful of blocks."""

from __future__ import annotations

import pytest

from kvcache.block_allocator import BlockAllocator, OutOfBlocksError
from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks
from kvcache.pool import BLOCK_SIZE, DUMMY_BLOCK


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


class Toy:
    """A 6-block pool (5 usable); checks the accounting invariant after every operation."""

    def __init__(self, num_blocks: int = 6, prefix_cache: bool = True) -> None:
        self.allocator = BlockAllocator(num_blocks, prefix_cache)
        self.manager = KVCacheManager(self.allocator)

    def seat(self, token_ids: list[int]) -> SequenceBlocks:
        """Seat a sequence like the scheduler does: prefix hit, then fresh blocks, then compute."""
        blocks = self.manager.find_cached_prefix(token_ids)
        assert self.manager.allocate_slots(blocks, len(token_ids), new_prefix_hit=True)
        self.manager.cache_full_blocks(blocks, token_ids, len(token_ids))
        self.allocator.check_invariants()
        return blocks

    def release(self, blocks: SequenceBlocks) -> None:
        self.manager.release(blocks)
        self.allocator.check_invariants()

    def refs(self, blocks: list[int]) -> list[int]:
        return [self.allocator.blocks[b].ref_count for b in blocks]


def test_dummy_block_is_never_handed_out():
    toy = Toy()
    handed = [toy.allocator.allocate() for _ in range(5)]
    toy.allocator.check_invariants()
    print("handed out:", handed)
    assert DUMMY_BLOCK not in handed and sorted(handed) == [1, 2, 3, 4, 5]


def test_common_prefix_is_shared_with_ref_counts():
    toy = Toy()
    system = tokens(2 * BLOCK_SIZE)
    a = toy.seat(system + tokens(5, 1000))
    b = toy.seat(system + tokens(7, 2000))
    print("a:", a.block_table, "b:", b.block_table, "refs:", toy.refs(a.block_table))
    assert a.block_table[:2] == b.block_table[:2]  # two shared full blocks
    assert a.block_table[2] != b.block_table[2]  # own tails
    assert toy.refs(a.block_table) == [2, 2, 1]
    assert toy.allocator.num_used == 4
    toy.release(a)
    assert toy.refs(b.block_table) == [1, 1, 1]
    toy.release(b)
    assert toy.allocator.num_used == 0


def test_last_token_is_always_recomputed():
    toy = Toy()
    prompt = tokens(2 * BLOCK_SIZE)  # exactly two full blocks
    toy.release(toy.seat(prompt))
    hit = toy.manager.find_cached_prefix(prompt)
    print("cached blocks found for an identical 32-token prompt:", len(hit.block_table))
    assert len(hit.block_table) == 1  # the second block holds the last token: recomputed


def test_freed_cached_block_is_revived_without_recompute():
    toy = Toy()
    prompt = tokens(BLOCK_SIZE + 3)
    first = toy.seat(prompt)
    cached_block = first.block_table[0]
    toy.release(first)
    assert toy.allocator.num_cached_free == 1 and toy.refs([cached_block]) == [0]
    again = toy.seat(prompt)
    print("revived block", cached_block, "->", again.block_table)
    assert again.block_table[0] == cached_block and toy.refs([cached_block]) == [1]
    assert toy.allocator.num_cached_free == 0


def test_eviction_is_least_recently_freed_first():
    toy = Toy(num_blocks=6)  # 5 usable
    seqs = [toy.seat(tokens(BLOCK_SIZE + 1, start=100 * i)) for i in range(2)]  # 2 blocks each
    heads = [s.block_table[0] for s in seqs]
    for s in seqs:  # seq 0's head is freed first, so it is the oldest
        toy.release(s)
    assert toy.allocator.num_cached_free == 2
    # Need 4 fresh blocks: 3 plain free ones, then the oldest cached one is evicted.
    hog = toy.seat(tokens(3 * BLOCK_SIZE + 1, start=9000))
    print("evicted first:", heads[0], "kept:", heads[1], "hog:", hog.block_table)
    assert heads[0] in hog.block_table and heads[1] not in hog.block_table
    assert toy.manager.find_cached_prefix(tokens(BLOCK_SIZE + 1, start=0)).block_table == []
    assert toy.manager.find_cached_prefix(tokens(BLOCK_SIZE + 1, start=100)).block_table == [
        heads[1]]


def test_running_out_is_a_clear_error_and_corrupts_nothing():
    toy = Toy(num_blocks=4)  # 3 usable
    held = [toy.allocator.allocate() for _ in range(3)]
    with pytest.raises(OutOfBlocksError, match="in use"):
        toy.allocator.allocate()
    toy.allocator.check_invariants()
    empty = SequenceBlocks()
    assert not toy.manager.allocate_slots(empty, 1)
    assert empty.block_table == []
    for block_id in held:
        toy.allocator.free(block_id)
    toy.allocator.check_invariants()
    assert toy.allocator.num_free == 3


def test_allocate_slots_counts_revived_blocks_and_is_all_or_nothing():
    toy = Toy(num_blocks=4)  # 3 usable
    prompt = tokens(BLOCK_SIZE + 1)
    toy.release(toy.seat(prompt))  # leaves 1 cached-free + 2 free
    hit = toy.manager.find_cached_prefix(tokens(BLOCK_SIZE) + [7] * 40)
    assert len(hit.block_table) == 1
    # 56 tokens need 4 blocks: the hit + 3 fresh, but only 2 remain once the hit is revived.
    before = (list(hit.block_table), toy.allocator.num_free, toy.allocator.num_cached_free)
    assert not toy.manager.allocate_slots(hit, BLOCK_SIZE + 40, new_prefix_hit=True)
    after = (list(hit.block_table), toy.allocator.num_free, toy.allocator.num_cached_free)
    print(f"refused: (table, free, cached-free) before {before}, after {after}")
    assert after == before  # a refusal changes nothing: the hit is not even revived
    toy.allocator.check_invariants()
    assert toy.manager.allocate_slots(hit, BLOCK_SIZE + 32, new_prefix_hit=True)
    assert len(hit.block_table) == 3 and toy.refs(hit.block_table) == [1, 1, 1]
    toy.release(hit)


def test_hash_collision_is_not_a_hit():
    toy = Toy()
    blocks = toy.seat(tokens(BLOCK_SIZE + 1))
    block = toy.allocator.blocks[blocks.block_table[0]]
    # Same hash, different tokens: the token comparison must refuse it.
    assert toy.allocator.lookup(block.block_hash, None, tokens(BLOCK_SIZE, 1)) is None
    assert toy.allocator.lookup(block.block_hash, None, tokens(BLOCK_SIZE)) == block.block_id


def test_prefix_cache_off_finds_nothing():
    toy = Toy(prefix_cache=False)
    prompt = tokens(2 * BLOCK_SIZE + 1)
    toy.release(toy.seat(prompt))
    assert toy.manager.find_cached_prefix(prompt).block_table == []
    assert toy.allocator.num_cached_free == 0 and toy.allocator.num_free == 5


def test_freeing_twice_is_refused():
    toy = Toy()
    block_id = toy.allocator.allocate()
    toy.allocator.free(block_id)
    with pytest.raises(ValueError):
        toy.allocator.free(block_id)
    toy.allocator.check_invariants()
