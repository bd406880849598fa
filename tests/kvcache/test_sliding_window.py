"""KV cache groups and sliding-window freeing, on a toy pool: one full-attention group and
two sliding groups with a window of 40 tokens (so a query at position p sees p-39 .. p)."""

from __future__ import annotations

import pytest
import torch

from kvcache.block_allocator import BlockAllocator
from kvcache.groups import KVCacheGroups
from kvcache.kv_cache_manager import KVCacheManager, SequenceBlocks, first_visible_block
from kvcache.pool import BLOCK_SIZE, DUMMY_BLOCK, KVCachePool

WINDOW = 40
FULL, SLIDING = 0, (1, 2)  # group indices


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


class Toy:
    """Three groups of one layer in one pool; invariants checked after every operation."""

    def __init__(self, num_blocks: int = 40) -> None:
        self.groups = KVCacheGroups.from_windows([None, WINDOW, WINDOW])
        self.allocator = BlockAllocator(num_blocks)
        self.manager = KVCacheManager(self.allocator, self.groups)

    def run(self, token_ids: list[int], blocks: SequenceBlocks | None = None,
            step: int = BLOCK_SIZE) -> SequenceBlocks:
        """Seat after the prefix hit (or go on from the last full block of `blocks`), then
        compute `step` tokens at a time as the scheduler does: slots, then (the step ran)
        cache full blocks and give back what the windows left behind."""
        if blocks is None:
            blocks = self.manager.find_cached_prefix(token_ids)
            assert self.manager.allocate_slots(blocks, len(blocks.hashes) * BLOCK_SIZE,
                                               new_prefix_hit=True)
        done = len(blocks.hashes) * BLOCK_SIZE
        while done < len(token_ids):
            done = min(done + step, len(token_ids))
            assert self.manager.allocate_slots(blocks, done)
            self.manager.cache_full_blocks(blocks, token_ids, done)
            self.manager.free_left_behind(blocks, done)
            self.allocator.check_invariants()
        return blocks

    def release(self, blocks: SequenceBlocks) -> None:
        self.manager.release(blocks)
        self.allocator.check_invariants()

    def evict(self, block_id: int) -> None:
        """Make a cached-free block unfindable, as eviction would."""
        self.allocator.acquire(block_id)
        self.allocator._forget(self.allocator.blocks[block_id])
        self.allocator.free(block_id)
        self.allocator.check_invariants()


def test_gemma3_270m_layers_make_six_groups_of_three():
    windows = [None if i % 6 == 5 else 512 for i in range(18)]  # every 6th layer full
    groups = KVCacheGroups.from_windows(windows)
    print(groups)
    assert groups.num_groups == 6 and groups.group_size == 3
    assert groups.layers[0] == (5, 11, 17) and groups.windows == (None, *[512] * 5)
    assert sorted(layer for g in groups.layers for layer in g) == list(range(18))
    pool = KVCachePool(18, 4, 1, 8, groups=groups)
    assert len({id(t) for t in pool.k}) == 3  # one tensor per place in a group
    assert pool.k[5] is pool.k[0] and pool.k[5] is not pool.k[11]
    assert pool.layer_group[5] == 0 and pool.layer_group[0] == 1


def test_a_model_without_windows_is_one_group_as_before():
    groups = KVCacheGroups.from_windows([None] * 4)
    assert groups == KVCacheGroups.single(4)
    pool = KVCachePool(4, 4, 1, 8, groups=groups)
    assert len({id(t) for t in pool.k}) == 4
    blocks = SequenceBlocks()
    manager = KVCacheManager(BlockAllocator(8), groups)
    assert manager.allocate_slots(blocks, 40) and len(blocks.tables) == 1
    manager.free_left_behind(blocks, 40)  # no sliding group: nothing to give back
    assert DUMMY_BLOCK not in blocks.block_table and len(blocks.block_table) == 3


def test_copying_a_block_copies_it_in_every_tensor_of_its_group():
    pool = KVCachePool(4, 4, 1, 8, groups=KVCacheGroups.from_windows([None, 8, None, 8]))
    assert pool.groups.layers == ((0, 2), (1, 3)) and len(pool._k) == 2
    for k in pool._k:
        k[1].normal_()
    pool.copy_blocks([(1, 3)])
    assert all(torch.equal(k[3], k[1]) for k in pool._k)


def test_block_is_given_back_at_the_first_query_that_cannot_see_it():
    toy = Toy()
    prompt = tokens(200)
    blocks = toy.run(prompt[:54], step=1)
    # Position 54 sees keys 15 .. 54: block 0 (tokens 0-15) is still in its window.
    assert first_visible_block(54, WINDOW) == 0
    assert all(blocks.tables[g][0] != DUMMY_BLOCK for g in SLIDING)
    block_0 = [blocks.tables[g][0] for g in range(3)]
    toy.run(prompt[:55], blocks, step=1)
    # Position 55 sees keys 16 .. 55: block 0 of each sliding group is given back.
    assert [blocks.tables[g][0] for g in range(3)] == [block_0[FULL], DUMMY_BLOCK, DUMMY_BLOCK]
    assert blocks.left_behind == [0, 1, 1]
    for g in SLIDING:  # full and computed: given back, but still findable
        assert toy.allocator.blocks[block_0[g]].ref_count == 0
        assert block_0[g] in toy.allocator.cached_free_ids()
    assert toy.allocator.blocks[block_0[FULL]].ref_count == 1
    toy.run(prompt, blocks)
    # At 200 tokens computed: the next position, 200, sees keys 161..200, from block 10 on.
    held = [sum(b != DUMMY_BLOCK for b in table) for table in blocks.tables]
    print(f"200 tokens: blocks held per group {held}, left behind {blocks.left_behind}")
    assert held == [13, 3, 3] and blocks.left_behind == [0, 10, 10]
    assert toy.allocator.num_used == 13 + 3 + 3
    toy.release(blocks)
    assert toy.allocator.num_used == 0


def test_a_hit_needs_the_window_of_sliding_groups_and_shortens_to_have_it():
    toy = Toy()
    prompt = tokens(100)
    toy.release(toy.run(prompt))  # every group's blocks cached-free
    hit = toy.manager.find_cached_prefix(prompt)
    # 6 full blocks (the last token is recomputed); a query at 96 sees keys 57..96: blocks
    # 3..5 are all a sliding group needs, the earlier ones are the dummy.
    assert len(hit.hashes) == 6 and len(hit.tables[FULL]) == 6
    for g in SLIDING:
        assert hit.tables[g][:3] == [DUMMY_BLOCK] * 3 and DUMMY_BLOCK not in hit.tables[g][3:]
    # An evicted block a sliding group no longer needs does not shorten the hit.
    toy.evict(toy.allocator.lookup(hit.hashes[0], None, prompt[:BLOCK_SIZE], group=1))
    assert len(toy.manager.find_cached_prefix(prompt).hashes) == 6
    # One inside the window does: 6 blocks need 3..5, 5 blocks need 2..4, 4 need 1..3.
    toy.evict(toy.allocator.lookup(hit.hashes[4], hit.hashes[3],
                                   prompt[4 * BLOCK_SIZE:5 * BLOCK_SIZE], group=2))
    shorter = toy.manager.find_cached_prefix(prompt)
    print("hit after evicting block 4 of group 2:", shorter.tables)
    assert len(shorter.hashes) == 4 and shorter.tables[2][:1] == [DUMMY_BLOCK]
    assert shorter.tables[1][:1] == [DUMMY_BLOCK] and len(shorter.tables[1]) == 4
    # A full-attention group needs every block from the left: without its block 1, only
    # block 0 could be reused, and group 1 no longer has that one.
    toy.evict(toy.allocator.lookup(hit.hashes[1], hit.hashes[0],
                                   prompt[BLOCK_SIZE:2 * BLOCK_SIZE], group=FULL))
    assert toy.manager.find_cached_prefix(prompt).hashes == []
    # The hit, taken and computed on, matches a fresh run's held blocks.
    blocks = toy.run(prompt + tokens(30, 500))
    assert blocks.left_behind == [0, 5, 5]
    toy.release(blocks)


def test_a_taken_hit_revives_only_what_it_holds_and_computes_on():
    toy = Toy()
    prompt = tokens(100)
    toy.release(toy.run(prompt))
    cached = toy.allocator.num_cached_free
    hit = toy.manager.find_cached_prefix(prompt)
    assert toy.manager.allocate_slots(hit, 96, new_prefix_hit=True)
    assert toy.allocator.num_used == 6 + 3 + 3 and toy.allocator.num_cached_free == cached - 12
    toy.run(prompt, hit)
    assert len(hit.hashes) == 6 and toy.allocator.num_used == 7 + 4 + 4
    toy.release(hit)


def test_fork_shares_every_group_and_copies_each_partial_block_on_write():
    toy = Toy()
    parent = toy.run(tokens(70))  # the last block (64..69) partly filled
    sample = toy.manager.fork(parent)
    assert sample.tables == parent.tables and sample.left_behind == parent.left_behind
    assert all(toy.allocator.blocks[b].ref_count == 2 for b in parent.held())
    assert toy.manager.allocate_slots(sample, 71, write_from=70)
    copies = toy.manager.take_block_copies()
    print("copy-on-write:", copies)
    assert [s for s, _ in copies] == [parent.tables[g][4] for g in range(3)]
    assert all(sample.tables[g][4] == d for g, (_, d) in enumerate(copies))
    # Each gives back its own references as it moves on.
    toy.manager.free_left_behind(parent, 90)
    toy.manager.free_left_behind(sample, 90)
    toy.allocator.check_invariants()
    toy.release(parent)
    toy.release(sample)
    assert toy.allocator.num_used == 0


def test_allocation_is_all_or_nothing_across_groups():
    toy = Toy(num_blocks=9)  # 8 usable: 40 tokens need 3 blocks in each of 3 groups
    blocks = SequenceBlocks()
    assert toy.manager.blocks_needed(blocks, 40) == 9
    assert not toy.manager.allocate_slots(blocks, 40)
    assert blocks.tables == [[], [], []] and toy.allocator.num_free == 8
    assert toy.manager.allocate_slots(blocks, 32)
    assert toy.manager.blocks_needed(blocks, 40) == 3 and toy.allocator.num_free == 2
    toy.release(blocks)


def test_rejected_drafts_give_back_their_blocks_in_every_group():
    toy = Toy()
    blocks = toy.run(tokens(60))
    assert toy.manager.allocate_slots(blocks, 70)  # drafts up to 70: block 4 in each group
    toy.manager.free_blocks_after(blocks, 61)
    assert [len(t) for t in blocks.tables] == [4, 4, 4]
    toy.allocator.check_invariants()
    toy.release(blocks)


def test_release_after_freeing_gives_each_block_back_once():
    toy = Toy()
    blocks = toy.run(tokens(150))
    toy.release(blocks)
    assert toy.allocator.num_used == 0 and blocks.tables == [[], [], []]
    assert blocks.left_behind == [0, 0, 0]


@pytest.mark.parametrize("num_computed", [0, 1, 39, 40, 54, 55, 56, 71, 200])
def test_first_visible_block_is_the_block_of_the_oldest_key_seen(num_computed):
    # The masks' rule (model/attention/metadata.py): a query sees keys at distance < window.
    seen = [key for key in range(num_computed + 1) if num_computed - key < WINDOW]
    assert first_visible_block(num_computed, WINDOW) == min(seen) // BLOCK_SIZE
