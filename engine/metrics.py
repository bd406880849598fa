"""Prometheus metrics, named like vLLM's (`vllm:` becomes `nano_vllm:`) so dashboards adapt.

Each engine has its own registry; gauges are read from the engine when scraped,
so the hot path only bumps counters and histograms.

Where each counts: tokens (generation_tokens, TTFT, ITL), steps (prompt tokens, prefix
cache, preemptions, speculative decoding) and request latencies (e2e, queue time) are the
engine's, in whichever process it runs; a token counts once generated, so one generated
past a stop string (the rest of a speculative step's, or, with the engine core in its own
process, those of the steps it ran before it took in the request's end) counts too. Finished
requests by reason (request_success) are counted where a request's last output is made, in
the front (engine/text_outputs.py), as only there is a stop string found: FrontMetrics
renders the engine's metrics and then these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from engine.core import EngineStats, StepResult
    from engine.request import Request

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                   1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
P = "nano_vllm:"

# The counters the dashboard charts, by sample name (summed over labels), with the page's keys.
DASHBOARD_COUNTERS = {
    P + "generation_tokens_total": "generation_tokens",
    P + "prompt_tokens_total": "prompt_tokens",
    P + "prefix_cache_queries_total": "prefix_queries",
    P + "prefix_cache_hits_total": "prefix_hits",
    P + "num_preemptions_total": "preemptions",
    P + "request_success_total": "finished",
    P + "time_to_first_token_seconds_sum": "ttft_sum",
    P + "time_to_first_token_seconds_count": "ttft_count",
    P + "inter_token_latency_seconds_sum": "itl_sum",
    P + "inter_token_latency_seconds_count": "itl_count",
}


def finish_counter(registry: CollectorRegistry) -> Counter:
    """request_success, by finish reason (see above for where it counts)."""
    return Counter(P + "request_success", "Finished requests.", ["finished_reason"],
                   registry=registry)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prefill tokens processed.", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens.", registry=r)
        self.prefix_cache_queries = Counter(
            P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", registry=r)
        self.prefix_cache_hits = Counter(
            P + "prefix_cache_hits", "Prompt tokens found in the prefix cache (or copied "
            "from a seated request's partly matching block).", registry=r)
        self.preemptions = Counter(P + "num_preemptions", "Requests preempted.", registry=r)
        self.embedding_inputs = Counter(P + "embedding_inputs", "Inputs embedded (each text "
                                        "of an embedding, rerank or score request).", registry=r)
        self.embedding_tokens = Counter(P + "embedding_tokens", "Tokens of the inputs embedded.",
                                        registry=r)
        self.spec_decode = SpecDecodeMetrics(r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between output tokens.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to finish.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Arrival to first seated.",
                                    buckets=LATENCY_BUCKETS, registry=r)

    def dashboard_totals(self) -> dict[str, float]:
        """DASHBOARD_COUNTERS' values, read from the metric objects /metrics renders (only
        these: collecting the whole registry would also compute every gauge)."""
        totals = dict.fromkeys(DASHBOARD_COUNTERS.values(), 0.0)
        for metric in (self.generation_tokens, self.prompt_tokens, self.prefix_cache_queries,
                       self.prefix_cache_hits, self.preemptions,
                       self.ttft, self.itl):
            if metric is None:
                continue
            for family in metric.collect():
                for sample in family.samples:
                    key = DASHBOARD_COUNTERS.get(sample.name)
                    if key is not None:
                        totals[key] += sample.value
        return totals

    def add_gauges(self, read: Callable[[], EngineStats]) -> None:
        """Gauges computed at scrape time from the engine's stats() (a dict of counts)."""
        specs = {
            "num_requests_running": ("running", "Requests seated in the batch."),
            "num_requests_waiting": ("waiting", "Requests waiting for a seat."),
            "kv_blocks_total": ("blocks_total", "Usable KV cache blocks."),
            "kv_blocks_used": ("blocks_used", "KV cache blocks held by requests."),
            "kv_blocks_free": ("blocks_free", "KV cache blocks holding nothing findable."),
            "kv_blocks_cached_free": ("blocks_cached_free",
                                      "Free blocks that still hold a findable cached prefix."),
        }
        for name, (key, doc) in specs.items():
            Gauge(P + name, doc, registry=self.registry).set_function(
                lambda key=key: read()[key])

        def usage() -> float:
            stats = read()
            return stats["blocks_used"] / max(stats["blocks_total"], 1)

        Gauge(P + "kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).",
              registry=self.registry).set_function(usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # --- hooks called by the engine thread ---

    def on_step(self, step: StepResult) -> None:
        self.preemptions.inc(step.num_preempted)
        self.prefix_cache_queries.inc(step.prefix_queried_tokens)
        self.prefix_cache_hits.inc(step.prefix_hit_tokens)
        self.prompt_tokens.inc(step.num_prompt_tokens)
        self.spec_decode.observe(step.drafts)
        if step.embedded_inputs:
            self.embedding_inputs.inc(step.embedded_inputs)
            self.embedding_tokens.inc(step.num_prompt_tokens)

    def on_token(self, request: Request, now: float) -> None:
        self.generation_tokens.inc()
        if request.first_token_time is None:
            request.first_token_time = now
            self.ttft.observe(now - request.arrival_time)
        else:
            self.itl.observe(now - request.last_token_time)
        request.last_token_time = now

    def on_finish(self, request: Request, now: float) -> None:
        self.e2e.observe(now - request.arrival_time)
        if request.scheduled_time is not None:
            self.queue_time.observe(request.scheduled_time - request.arrival_time)


class FinishMetrics:
    """request_success, counted where a request's last output is made (the front): its own
    registry, rendered after the engine's."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_success = finish_counter(self.registry)
        self.total = 0  # the dashboard's "finished"

    def on_finish(self, reason: str) -> None:
        self.request_success.labels(reason).inc()
        self.total += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


class FrontMetrics:
    """/metrics' text: the engine loop's (`render_engine`: in this process, or a core
    process's answer), then the finished requests by reason, counted in the front."""

    def __init__(self, render_engine: Callable[[], bytes], finishes: FinishMetrics) -> None:
        self._render_engine = render_engine
        self.finishes = finishes

    def render(self) -> bytes:
        return self._render_engine() + self.finishes.render()

    def dashboard_totals(self) -> dict[str, float]:
        """The dashboard's counters that are counted in the front."""
        return {"finished": float(self.finishes.total)}


class SpecDecodeMetrics:
    """vLLM's speculative-decoding counters: drafts (verified steps of one request), draft
    tokens, accepted tokens, and accepted tokens by draft position (the acceptance rate is
    accepted / draft tokens; kept also as a gauge, vLLM v0's draft_acceptance_rate)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.num_drafts = Counter(P + "spec_decode_num_drafts",
                                  "Requests whose drafts were verified, summed over steps.",
                                  registry=r)
        self.num_draft_tokens = Counter(P + "spec_decode_num_draft_tokens",
                                        "Drafted tokens verified.", registry=r)
        self.num_accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens",
                                           "Drafted tokens accepted.", registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Drafted tokens accepted, by position in the draft.",
                                        ["position"], registry=r)
        self.acceptance_rate = Gauge(P + "spec_decode_draft_acceptance_rate",
                                     "Accepted / drafted tokens so far.", registry=r)
        self._drafted = self._accepted = 0
        self.acceptance_rate.set_function(lambda: self._accepted / max(self._drafted, 1))

    def observe(self, drafts: list[tuple[int, int]]) -> None:
        """drafts: (drafted, accepted) per request that verified drafts this step."""
        for drafted, accepted in drafts:
            self.num_drafts.inc()
            self.num_draft_tokens.inc(drafted)
            self.num_accepted_tokens.inc(accepted)
            self._drafted += drafted
            self._accepted += accepted
            for position in range(accepted):
                self.accepted_per_pos.labels(str(position)).inc()
