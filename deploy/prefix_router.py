"""A prefix-aware request router for Ray Serve, written on its public RequestRouter API.

Each replica's engine keeps a prefix cache, so a request is cheapest on the replica that
already holds its prompt's start. The router remembers which replica each prompt was sent to
(deploy/prefix_index.py) and, for a new request:

1. takes the replicas holding the longest remembered prefix of its prompt, if that prefix is
   at least `min_match_chars` long and those replicas are not busier than the least-loaded
   one by more than `imbalance_threshold` requests: the request goes there;
2. otherwise ranks every replica by load (requests in flight), ties going to the replica
   that was sent a request longest ago (one never sent any first), so new prompt families
   spread out and a replica that has just started (a replacement, a scale-up) takes the next
   such request instead of waiting for the others to be busier.

The tie-break is not by list position: Ray Serve lists replicas oldest first, so at equal
load the oldest would win every time; requests one at a time are always at equal load (none
in flight), and a new replica would then get none of them.

Ray Serve tries the ranks in order and skips a replica whose queue is full. Why not Ray's
own `ray.serve.llm.request_router.PrefixCacheAffinityRouter`: importing `ray.serve.llm` needs
the `ray[llm]` extra, which pins vLLM and CUDA libraries, far more than this project installs;
it also keeps its prefix tree in a separate actor reached with blocking calls. This one keeps
its index in the router itself (one per handle; the ingress holds the only handle).
"""

from __future__ import annotations

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from deploy.prefix_index import PrefixIndex


def routing_text(pending_request: PendingRequest | None) -> str:
    """The prompt text a request carries for routing (deploy/replica.py's ForwardedRequest)."""
    if pending_request is None:
        return ""
    for arg in pending_request.args:
        text = getattr(arg, "routing_text", None)
        if isinstance(text, str):
            return text
    return ""


class PrefixAwareRouter(RequestRouter):
    def initialize_state(self, chunk_chars: int = 64, max_chunks: int = 100_000,
                         min_match_chars: int = 64, imbalance_threshold: int = 8) -> None:
        """Called by Ray Serve with `request_router_kwargs`."""
        self.index = PrefixIndex(chunk_chars, max_chunks)
        self.min_match_chars = min_match_chars
        self.imbalance_threshold = imbalance_threshold
        self._routed = 0  # requests routed so far
        self._last_routed: dict[str, int] = {}  # replica -> the number of its latest request

    def _recency(self, replica: RunningReplica) -> int:
        """When the replica was last sent a request (-1: never): lower goes first."""
        return self._last_routed.get(replica.replica_id.to_full_id_str(), -1)

    def _load(self, replica: RunningReplica) -> int:
        """Requests in flight on a replica, as the router last heard (unknown: 0)."""
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            # When every rank is full, wait (with backoff) before asking again.
            pending_request.routing_context.should_backoff = True
        by_load = sorted(candidate_replicas, key=lambda r: (self._load(r), self._recency(r)))
        text = routing_text(pending_request)
        if not text:
            return [[r] for r in by_load]
        ids = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        match = self.index.match(text, ids)
        least = self._load(by_load[0])
        holders = [r for r in by_load if r.replica_id.to_full_id_str() in match.replicas
                   and self._load(r) - least <= self.imbalance_threshold]
        if match.chars < self.min_match_chars or not holders:
            return [[r] for r in by_load]
        others = [r for r in by_load if r not in holders]
        return [holders] + [[r] for r in others]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        replica = replica_id.to_full_id_str()
        self._routed += 1
        self._last_routed[replica] = self._routed
        text = routing_text(pending_request)
        if text:
            self.index.insert(text, replica)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget({replica_id.to_full_id_str()})

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        alive = {r.replica_id.to_full_id_str() for r in replicas}
        self._forget((self.index.replicas() | set(self._last_routed)) - alive)

    def _forget(self, gone: set[str]) -> None:
        self.index.forget(gone)
        for replica in gone:
            self._last_routed.pop(replica, None)
