"""One HTTP request's work in the engine: its prompts, each run as `num_samples` samples,
and what has come back for each so far.

Choices are indexed as OpenAI does: prompt_index * n + sample_index. With best_of above n,
the n samples of highest cumulative logprob are returned, best first.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from api.openai.bodies import Timing, Usage
from api.thinking import PromptThinking
from engine.logprobs import TokenLogprobs
from engine.request import RequestOutput


@dataclass
class Prompt:
    token_ids: list[int]
    text: str | None = None  # as sent; None when sent as token ids
    # How the rendered chat prompt leaves a thinking model's span (api/thinking.py).
    thinking: PromptThinking = "free"


@dataclass
class SampleResult:
    """One sample's outputs so far."""

    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per output token
    num_output_tokens: int = 0
    reasoning_tokens: int = 0  # of the output tokens, those thinking (engine/thinking.py)
    num_outputs: int = 0
    text_offset: int = 0  # completions' logprobs: where the next token's text starts
    last: RequestOutput | None = None  # the final output, once in

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def add(self, output: RequestOutput) -> None:
        self.texts.append(output.text)
        self.logprobs.extend(output.logprobs or [])
        self.num_output_tokens = output.num_output_tokens
        self.reasoning_tokens = output.reasoning_tokens
        self.num_outputs += 1
        if output.finished:
            self.last = output


@dataclass
class Job:
    response_id: str  # the response's `id`
    model: str
    prompts: list[Prompt]
    n: int  # choices per prompt
    num_samples: int  # samples run per prompt (best_of, else n)
    # (prompt index, output) from the engine; None: time to check the client is still there
    queue: asyncio.Queue[tuple[int, RequestOutput] | None] = field(
        default_factory=asyncio.Queue)
    request_ids: list[str] = field(default_factory=list)  # the engine's, one per prompt
    created: int = field(default_factory=lambda: int(time.time()))
    samples: dict[tuple[int, int], SampleResult] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs | None]] = field(default_factory=dict)
    streams: dict[int, Any] = field(default_factory=dict)  # what a stream keeps per choice
    cached_tokens: dict[int, int] = field(default_factory=dict)  # per prompt
    client_id: str = ""  # the request's id as the client sees it (X-Request-Id)

    def record(self, prompt_index: int, output: RequestOutput) -> SampleResult:
        sample = self.samples.setdefault((prompt_index, output.sample_index), SampleResult())
        sample.add(output)
        if output.prompt_logprobs is not None:
            self.prompt_logprobs[prompt_index] = output.prompt_logprobs
        if output.sample_index == 0:
            self.cached_tokens[prompt_index] = output.num_cached_tokens
        return sample

    @property
    def done(self) -> bool:
        finished = sum(s.last is not None for s in self.samples.values())
        return finished == len(self.prompts) * self.num_samples

    def choice_index(self, prompt_index: int, sample_index: int) -> int:
        return prompt_index * self.n + sample_index

    def ranked(self, prompt_index: int) -> list[tuple[int, SampleResult]]:
        """(choice index, sample) for the n samples one prompt returns, in choice order."""
        samples = [self.samples[prompt_index, s] for s in range(self.num_samples)]
        if self.num_samples > self.n:
            samples.sort(key=cumulative_logprob, reverse=True)
        return [(self.choice_index(prompt_index, rank), sample)
                for rank, sample in enumerate(samples[:self.n])]

    def usage(self) -> Usage:
        """Each prompt counted once; every sample's tokens, returned or not (best_of)."""
        return Usage.of(sum(len(p.token_ids) for p in self.prompts),
                        sum(s.num_output_tokens for s in self.samples.values()),
                        sum(self.cached_tokens.values()),
                        sum(s.reasoning_tokens for s in self.samples.values()))

    def timing(self) -> list[Timing]:
        """One record per prompt, over its samples (once all have finished)."""
        records = []
        for i in range(len(self.prompts)):
            timings = [t for s in range(self.num_samples)
                       if (t := self._final(i, s).timing) is not None]
            first = timings[0]
            records.append(Timing(
                prompt_index=i, queue_time_ms=ms(first.queue_time),
                time_to_first_token_ms=ms(min_of([t.time_to_first_token for t in timings])),
                decode_time_ms=ms(max_of([t.decode_time for t in timings])),
                prompt_tokens_computed=sum(t.prompt_tokens_computed for t in timings),
                prompt_tokens_cached=first.prompt_tokens_cached,
                num_preemptions=sum(t.num_preemptions for t in timings)))
        return records

    def server_timing(self) -> str:
        """The Server-Timing header: the slowest prompt's queue, TTFT and decode times."""
        records = self.timing()
        parts = []
        for name, key in (("queue", "queue_time_ms"), ("ttft", "time_to_first_token_ms"),
                          ("decode", "decode_time_ms")):
            value = max_of([getattr(r, key) for r in records])
            if value is not None:
                parts.append(f"{name};dur={value:.1f}")
        return ", ".join(parts)

    def _final(self, prompt_index: int, sample_index: int) -> RequestOutput:
        last = self.samples[prompt_index, sample_index].last
        assert last is not None, "the job is not done"
        return last


def cumulative_logprob(sample: SampleResult) -> float:
    last = sample.last
    return last.cumulative_logprob or 0.0 if last is not None else 0.0


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def min_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def max_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
