"""The dashboard's side of an engine core in its own process, in the API process.

The core takes its snapshots (engine/snapshot.py) only while someone watches: `want()`
tells it so (a `Watch` at most every WATCH_RESEND seconds, well within the core board's
watch timeout), and each snapshot it takes arrives here as it is (engine/process/messages.py).
A cached-free block's content is asked of the core, which reads its pool between two
steps, as the in-process engine's own thread does (BatchEngine.cached_block).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import msgspec

from engine.process.messages import BlockAnswer, BlockQuery, Snapshot, ToCore, Watch
from engine.snapshot import CachedBlock, EngineSnapshot

WATCH_RESEND = 0.5  # seconds between two Watch messages while someone watches


class ReceivedSnapshots:
    """The core's latest snapshot, as the dashboard's routes read a SnapshotBoard."""

    def __init__(self, send: Callable[[ToCore], None],
                 own_counters: Callable[[], dict[str, float]] | None = None) -> None:
        self.latest: EngineSnapshot | None = None
        self._send = send  # to the core; any thread
        self._own_counters = own_counters  # the counters kept in this process, not the core
        self._told = float("-inf")
        self._lock = threading.Lock()
        self._queries: dict[int, Future[CachedBlock | None]] = {}
        self._last_query = 0

    def want(self) -> None:
        now = time.monotonic()
        if now - self._told >= WATCH_RESEND:
            self._told = now
            self._send(Watch())

    def cached_block(self, block_id: int, timeout: float) -> CachedBlock | None:
        """Ask the core; TimeoutError if it does not answer in time."""
        future: Future[CachedBlock | None] = Future()
        with self._lock:
            self._last_query += 1
            query = self._last_query
            self._queries[query] = future
        try:
            self._send(BlockQuery(query, block_id))
            return future.result(timeout)
        finally:
            with self._lock:
                self._queries.pop(query, None)

    # --- the client's receiver thread ------------------------------------------------------

    def received(self, message: Snapshot) -> None:
        snapshot = msgspec.json.decode(message.snapshot, type=EngineSnapshot)
        if self._own_counters is not None:
            snapshot.counters.update(self._own_counters())
        self.latest = snapshot

    def answered(self, message: BlockAnswer) -> None:
        with self._lock:
            future = self._queries.get(message.query)
        if future is not None:  # not given up on already
            future.set_result(msgspec.json.decode(message.block, type=CachedBlock | None))
