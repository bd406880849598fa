"""What the dashboard shows: snapshots of the engine's state, taken between steps.

The engine thread owns the scheduler and the block pool, so only it may read them. After
a step it appends a small `StepRecord` (always: a few ints), and, only while someone
watches and at most every `min_interval` seconds, takes an `EngineSnapshot`: counts, ids
and copies of each seated request's block table, hashes and token ids, and the counters
the page charts; no tensors. The snapshot is immutable and replaces the previous one in a
single attribute, which the API thread reads as it is (or, with the engine core in its own
process, which is sent to the API process as it is: engine/process/messages.py). Everything
derived from it (each block's reference count and owners, token text) is computed on the
reader's side, not on the engine thread. What a snapshot does not copy, a cached-free
block's content, the engine thread reads on request (`read_cached_block`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.request import Request
from engine.scheduler import Scheduler
from kvcache.block_allocator import BlockAllocator
from kvcache.pool import BLOCK_SIZE, DUMMY_BLOCK

STEP_HISTORY = 120  # step records kept, for the page's step chart
BLOCK_QUERY_TIMEOUT = 2.0  # seconds for the engine thread to read a block for the dashboard


@dataclass(frozen=True)
class StepRecord:
    """One engine step: what it computed against the token budget, and how long it took."""

    step: int
    time: float  # time.monotonic() when it ended
    prefill_tokens: int  # prompt tokens (chunks of prefill, recomputation after preemption)
    decode_tokens: int  # every other scheduled token
    duration_ms: float
    running: int
    waiting: int
    preempted: int


@dataclass(frozen=True)
class RequestView:
    """One seated or waiting request, as the page lists it."""

    request_id: str
    status: str  # "running" or "waiting"
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens found in the prefix cache when first seated
    num_computed_tokens: int  # tokens whose K/V are in the cache now
    num_output_tokens: int
    max_tokens: int
    num_preemptions: int
    # One block table per KV cache group (one for a model without sliding windows); in a
    # sliding group, block 0 (the dummy) where the window has given the block back.
    block_tables: tuple[tuple[int, ...], ...]
    block_hashes: tuple[int, ...]  # for the leading full blocks that are findable
    token_ids: tuple[int, ...]  # prompt and output so far

    @property
    def block_table(self) -> tuple[int, ...]:
        """The first group's table: the only one for a model without sliding windows."""
        return self.block_tables[0] if self.block_tables else ()

    def held(self) -> list[int]:
        """Every block it holds, in all groups."""
        return [b for table in self.block_tables for b in table if b != DUMMY_BLOCK]

    @property
    def num_left_behind(self) -> int:
        """Blocks its sliding-window groups have given back (or never took, after a prefix
        hit): what it would hold more if every layer kept every token."""
        return sum(table.count(DUMMY_BLOCK) for table in self.block_tables)


@dataclass(frozen=True)
class BlockView:
    """One block of the pool, derived from a snapshot. state: "free", "used" or "cached"
    (cached-free: held by no one, still findable by its hash, evictable)."""

    block_id: int
    state: str
    ref_count: int
    owners: tuple[str, ...]  # request ids whose block tables hold it, in seating order
    position: int | None  # its index in the owners' block tables: tokens 16*i .. 16*i+15
    group: int  # the KV cache group whose table holds it (0 for a model of one group)
    block_hash: int | None  # None: not full yet, or not findable
    parent_hash: int | None


@dataclass(frozen=True)
class EngineSnapshot:
    seq: int  # increases with every snapshot
    time: float  # time.monotonic()
    step: int  # steps run so far
    num_blocks: int  # including the dummy block 0
    block_size: int
    token_budget: int
    max_num_seqs: int
    requests: tuple[RequestView, ...]  # running in seating order, then the waiting line
    cached_free: tuple[int, ...]  # oldest first: the next to be evicted comes first
    steps: tuple[StepRecord, ...]  # the most recent steps, oldest first
    counters: dict[str, float] = field(default_factory=dict)  # EngineMetrics.dashboard_totals
    # Per KV cache group, its layers' window (None: full attention), and layers per group.
    group_windows: tuple[int | None, ...] = (None,)
    group_size: int = 0  # 0: not known

    def grid(self) -> tuple[list[int], list[int]]:
        """The whole pool in two lists indexed by block id, cheap enough for every frame:
        reference counts (-1: cached-free, 0: free or the dummy) and the index in `requests`
        of each block's first owner (-1: none)."""
        refs, owner = [0] * self.num_blocks, [-1] * self.num_blocks
        for block_id in self.cached_free:
            refs[block_id] = -1
        for index, request in enumerate(self.requests):
            for block_id in request.held():
                if refs[block_id] <= 0:
                    refs[block_id], owner[block_id] = 1, index
                else:
                    refs[block_id] += 1
        return refs, owner

    def block(self, block_id: int) -> BlockView:
        """One usable block: who holds it, where it sits in their sequences, its hashes."""
        if not 0 < block_id < self.num_blocks:
            raise IndexError(f"block {block_id} is not a usable block (1..{self.num_blocks - 1})")
        owners, position, block_hash, parent, group = [], None, None, None, 0
        for request in self.requests:
            where = next(((g, table.index(block_id))
                          for g, table in enumerate(request.block_tables) if block_id in table),
                         None)
            if where is None:
                continue
            owners.append(request.request_id)
            (g, i), hashes = where, request.block_hashes
            if position is None or (block_hash is None and i < len(hashes)):
                position, group = i, g
                block_hash = hashes[i] if i < len(hashes) else None
                parent = hashes[i - 1] if 0 < i <= len(hashes) else None
        state = "used" if owners else "cached" if block_id in self.cached_free else "free"
        return BlockView(block_id, state, len(owners), tuple(owners), position, group,
                         block_hash, parent)

    def blocks(self) -> list[BlockView]:
        """Every usable block (1 .. num_blocks-1); for tests and tools, not every frame."""
        return [self.block(i) for i in range(1, self.num_blocks)]

    def request(self, request_id: str) -> RequestView | None:
        return next((r for r in self.requests if r.request_id == request_id), None)


def view_request(request: Request) -> RequestView:
    return RequestView(
        request.request_id, request.status.value, request.num_prompt_tokens,
        request.num_cached_tokens, request.num_computed_tokens, request.num_output_tokens,
        request.params.max_tokens, request.num_preemptions,
        tuple(tuple(table) for table in request.blocks.tables), tuple(request.blocks.hashes),
        tuple(request.token_ids))


def take_snapshot(scheduler: Scheduler, seq: int = 0, step: int = 0,
                  steps: tuple[StepRecord, ...] = (),
                  counters: dict[str, float] | None = None) -> EngineSnapshot:
    """Copy what the page needs out of the scheduler and its pool (engine thread only)."""
    kv = scheduler.kv
    allocator = kv.allocator
    requests = tuple(view_request(r) for r in [*scheduler.running, *scheduler.waiting])
    return EngineSnapshot(seq, time.monotonic(), step, allocator.num_blocks, BLOCK_SIZE,
                          scheduler.max_num_batched_tokens, scheduler.max_num_seqs, requests,
                          allocator.cached_free_ids(), steps, counters or {}, kv.windows,
                          kv.group_size)


@dataclass(frozen=True)
class CachedBlock:
    """What a cached-free block holds (the pool's record, not in any snapshot)."""

    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    position: int | None  # findable blocks before it in its hash chain (None: chain broken)


def read_cached_block(allocator: BlockAllocator, block_id: int) -> CachedBlock | None:
    """A cached-free block's content, or None if it is not cached-free (engine thread only)."""
    if not 0 < block_id < allocator.num_blocks:
        return None
    block = allocator.blocks[block_id]
    if block.ref_count or block.block_hash is None:
        return None
    return CachedBlock(block.block_hash, block.parent_hash, tuple(block.token_ids),
                       chain_depth(allocator, block.parent_hash, allocator.num_blocks,
                                   block.group))


def chain_depth(allocator: BlockAllocator, parent_hash: int | None, limit: int,
                group: int = 0) -> int | None:
    """How many findable blocks of this group come before one whose parent is `parent_hash`
    (None if the chain breaks: an ancestor was evicted)."""
    depth = 0
    while parent_hash is not None:
        parent = allocator.block_for_hash(parent_hash, group)
        if parent is None or depth >= limit:
            return None
        parent_hash, depth = allocator.blocks[parent].parent_hash, depth + 1
    return depth


@dataclass
class SnapshotBoard:
    """Where the engine thread posts step records and snapshots, and the API reads them.

    `want()` (any thread) says someone is watching; snapshots are taken only while a
    want is fresher than `watch_timeout`, so an unwatched engine pays one StepRecord a step.
    """

    min_interval: float = 0.1  # at most ~10 snapshots a second
    watch_timeout: float = 2.0
    latest: EngineSnapshot | None = None
    steps: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    num_steps: int = 0
    wake: Callable[[], None] | None = None  # wakes an idle engine thread
    counters: Callable[[], dict[str, float]] | None = None  # read into each snapshot
    _wanted_at: float = float("-inf")
    _dirty: bool = True  # the engine changed since the latest snapshot

    def want(self) -> None:
        self._wanted_at = time.monotonic()
        if self.wake is not None:
            self.wake()

    @property
    def watched(self) -> bool:
        return time.monotonic() - self._wanted_at < self.watch_timeout

    # --- engine thread -------------------------------------------------------------------

    def record_step(self, record: StepRecord) -> None:
        self.num_steps += 1
        self.steps.append(record)
        self._dirty = True

    def note_change(self) -> None:
        """Something changed without a step (requests aborted or arrived in a round that
        computed nothing): the next look takes a snapshot."""
        self._dirty = True

    def maybe_snapshot(self, scheduler: Scheduler, idle: bool = False) -> None:
        """Take a snapshot if someone watches and the latest is stale (after a step: older
        than min_interval; when idle: anything changed since)."""
        if not self.watched or not (self._dirty or self.latest is None):
            return
        now = time.monotonic()
        if not idle and self.latest is not None and now - self.latest.time < self.min_interval:
            return
        seq = 0 if self.latest is None else self.latest.seq + 1
        self._dirty = False
        counters = self.counters() if self.counters is not None else None
        self.latest = take_snapshot(scheduler, seq, self.num_steps, tuple(self.steps), counters)


class StepRecorder:
    """The engine thread's side of the dashboard, for a core with a scheduler and a pool
    (a core without, the baseline's, has nothing to show): a StepRecord after every step
    that ran, a snapshot when one is due, a cached-free block's content when asked."""

    def __init__(self, scheduler: Scheduler, board: SnapshotBoard) -> None:
        self.scheduler = scheduler
        self.board = board

    @classmethod
    def for_core(cls, core: object, wake: Callable[[], None],
                 counters: Callable[[], dict[str, float]]) -> StepRecorder | None:
        """A recorder for `core`, if it has a scheduler to read (None otherwise)."""
        scheduler = getattr(core, "scheduler", None)
        if scheduler is None:
            return None
        return cls(scheduler, SnapshotBoard(wake=wake, counters=counters))

    def step_ran(self, prefill_tokens: int, decode_tokens: int, duration_ms: float,
                 running: int, waiting: int, preempted: int) -> None:
        board = self.board
        board.record_step(StepRecord(board.num_steps + 1, time.monotonic(), prefill_tokens,
                                     decode_tokens, duration_ms, running, waiting, preempted))
        board.maybe_snapshot(self.scheduler)

    def nothing_ran(self) -> None:
        """A round that computed nothing: aborts still change what the dashboard shows."""
        self.board.note_change()

    def idle(self) -> None:
        """With nothing to step: the last step's end for a watcher."""
        self.board.maybe_snapshot(self.scheduler, idle=True)

    def read_cached_block(self, block_id: int) -> CachedBlock | None:
        return read_cached_block(self.scheduler.kv.allocator, block_id)
