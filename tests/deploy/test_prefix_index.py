"""The prefix-aware router's memory (deploy/prefix_index.py), alone: no Ray needed."""

from __future__ import annotations

import pytest

from deploy.prefix_index import PrefixIndex

SYSTEM_A = "You are a patient astronomy tutor. " * 8
SYSTEM_B = "You are a terse cooking assistant. " * 8


def test_longest_prefix_wins_and_only_whole_chunks_count() -> None:
    index = PrefixIndex(chunk_chars=16)
    index.insert(SYSTEM_A + "What is a comet?", "r1")
    index.insert(SYSTEM_B + "How long do I boil an egg?", "r2")
    index.insert(SYSTEM_A[:32], "r2")  # r2 saw only the first two chunks of A
    match = index.match(SYSTEM_A + "Why is Mars red?", ["r1", "r2"])
    print(match)
    assert match.replicas == {"r1"}
    assert match.chars == len(SYSTEM_A) // 16 * 16  # the shared whole chunks, not the question
    assert index.match(SYSTEM_A[:40], ["r2"]).chars == 32
    assert index.match("Something else entirely, nothing shared.", ["r1", "r2"]).chars == 0
    assert index.match(SYSTEM_A[:15], ["r1"]).chars == 0  # under one chunk: never a match


def test_only_candidates_are_matched() -> None:
    index = PrefixIndex(chunk_chars=16)
    index.insert(SYSTEM_A, "r1")
    assert index.match(SYSTEM_A, ["r2"]).replicas == frozenset()


def test_oldest_chunks_are_forgotten_past_the_cap() -> None:
    index = PrefixIndex(chunk_chars=16, max_chunks=20)
    index.insert(SYSTEM_A, "r1")  # 280 chars: 17 chunks
    index.insert(SYSTEM_B, "r2")  # 17 more: A's oldest (its start) go first
    print(len(index), index.chunks_held("r1"), index.chunks_held("r2"))
    assert len(index) == 20
    assert index.chunks_held("r1") == 3 and index.chunks_held("r2") == 17
    assert index.match(SYSTEM_A, ["r1"]).chars == 0  # its start is gone: no prefix left
    assert index.match(SYSTEM_B, ["r2"]).chars == 17 * 16


def test_forgotten_replicas_hold_nothing() -> None:
    index = PrefixIndex(chunk_chars=16)
    index.insert(SYSTEM_A, "r1")
    index.insert(SYSTEM_A, "r2")
    index.forget(["r1"])
    assert index.match(SYSTEM_A, ["r1", "r2"]).replicas == {"r2"}
    assert index.chunks_held("r1") == 0 and index.replicas() == {"r2"}


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(chunk_chars=0)
