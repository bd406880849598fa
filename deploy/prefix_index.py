"""Which replica has seen which prompt prefix: the memory behind the prefix-aware router.

A prompt's text is cut into chunks of `chunk_chars` characters; chunk k is named by a hash
chained over chunks 0..k, so equal names mean equal text from the start up to there (the
engine names its KV blocks the same way, over token ids). Each name remembers the replicas
that were sent a prompt containing it. The router matches a new prompt against this, chunk by
chunk, and prefers the replicas holding the longest match. Names are kept in least-recently-
used order and the oldest are forgotten past `max_chunks`, so memory stays bounded like the
replicas' caches do.

Plain Python, no Ray: the router (deploy/prefix_router.py) owns one, and tests drive it alone.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixMatch:
    chars: int  # length of the longest remembered prefix (whole chunks)
    replicas: frozenset[str]  # the candidates holding that prefix (empty: no match)


class PrefixIndex:
    def __init__(self, chunk_chars: int = 64, max_chunks: int = 100_000) -> None:
        if chunk_chars < 1 or max_chunks < 1:
            raise ValueError("chunk_chars and max_chunks must be at least 1")
        self.chunk_chars = chunk_chars
        self.max_chunks = max_chunks
        self._owners: OrderedDict[bytes, set[str]] = OrderedDict()  # oldest first
        self._held: Counter[str] = Counter()  # replica -> chunks it holds

    def _chunk_names(self, text: str) -> Iterator[bytes]:
        """Chained names of the text's whole chunks (a partial last chunk is not named)."""
        name = b""
        for start in range(0, len(text) - self.chunk_chars + 1, self.chunk_chars):
            chunk = text[start:start + self.chunk_chars].encode()
            name = hashlib.blake2b(name + chunk, digest_size=16).digest()
            yield name

    def match(self, text: str, candidates: Iterable[str]) -> PrefixMatch:
        """The longest prefix of `text` that some candidate was sent, and who holds it."""
        holders = frozenset(candidates)
        chunks = 0
        for name in self._chunk_names(text):
            owners = holders & self._owners.get(name, set())
            if not owners:
                break
            holders, chunks = frozenset(owners), chunks + 1
        if chunks == 0:
            return PrefixMatch(0, frozenset())
        return PrefixMatch(chunks * self.chunk_chars, holders)

    def insert(self, text: str, replica: str) -> None:
        """Remember that `replica` was sent `text` (its chunks become the most recent)."""
        for name in self._chunk_names(text):
            owners = self._owners.setdefault(name, set())
            if replica not in owners:
                owners.add(replica)
                self._held[replica] += 1
            self._owners.move_to_end(name)
        while len(self._owners) > self.max_chunks:
            _, evicted = self._owners.popitem(last=False)
            self._held.subtract(evicted)

    def forget(self, replicas: Iterable[str]) -> None:
        """Drop replicas that are gone (dead or scaled down) from every chunk."""
        gone = set(replicas) & set(self._held)
        if not gone:
            return
        for name in list(self._owners):
            owners = self._owners[name]
            owners -= gone
            if not owners:
                del self._owners[name]
        for replica in gone:
            del self._held[replica]

    def chunks_held(self, replica: str) -> int:
        """How many remembered chunks `replica` holds: a tie-break towards the emptier one."""
        return self._held[replica]

    def replicas(self) -> set[str]:
        return {replica for replica, held in self._held.items() if held > 0}

    def __len__(self) -> int:
        return len(self._owners)
