"""The kernels' work split (model/csrc/stealing_split.h): every item runs exactly once, and a
thread that comes late finds its range taken over by the others."""

from __future__ import annotations

import pytest

from model.cpu_kernel import load_cpu_kernels

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C++ toolchain to build the kernels")


@pytest.mark.parametrize("items,threads", [(0, 2), (1, 2), (9, 2), (200, 2), (200, 3), (7, 7)])
def test_every_item_runs_once(items: int, threads: int):
    owners = kernels.stealing_split_owners(items, threads, -1, 0, 1)
    assert owners.tolist() == [o for o in owners.tolist() if 0 <= o < threads]
    assert owners.numel() == items


def test_a_late_thread_finds_its_range_taken():
    # 200 items of ~50 us over 2 threads: thread 0 starts 100 ms late, by which time thread 1
    # has had time for all 200 (10 ms). Under a static split thread 0 would run its 100.
    owners = kernels.stealing_split_owners(200, 2, 0, 100_000, 50)
    assert (owners >= 0).all(), "an item ran twice or not at all"
    assert (owners == 0).sum() < 50, f"the late thread ran {(owners == 0).sum()} of its 100"


def test_with_no_one_late_each_thread_keeps_most_of_its_range():
    # The ranges stay contiguous streams: with no one held back, a thread runs mostly its own
    # half (stealing is for the tail, not a reshuffle).
    owners = kernels.stealing_split_owners(200, 2, -1, 0, 20).tolist()
    assert sum(o == 0 for o in owners[:100]) > 60
    assert sum(o == 1 for o in owners[100:]) > 60
