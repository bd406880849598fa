"""From new token ids to what a client receives: one RequestOutput per request per step
through the request's callback, with its tokens, logprobs and counts, and the metrics.

The outputs carry token ids and no text, each with the request's timing so far: the
front makes the text and finds stop strings (engine/text_outputs.py), in either mode."""

from __future__ import annotations

import time

from engine.metrics import EngineMetrics
from engine.request import FinishReason, Request, RequestOutput, RequestTiming
from engine.step_types import RequestUpdate


class OutputProcessor:
    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics
        self._unfinished: set[str] = set()
        self._prompt_logprobs_sent: set[str] = set()

    def add(self, request: Request) -> None:
        self._unfinished.add(request.request_id)

    def process(self, update: RequestUpdate, now: float) -> None:
        """Hand out one request's new tokens. A stop token or length may have ended the
        request already (update.finish_reason): this sends its last output."""
        request = update.request
        output = RequestOutput(request.request_id, "", list(update.new_token_ids),
                               finished=update.finish_reason is not None,
                               finish_reason=update.finish_reason, embedding=update.embedding)
        # One entry per token sent, the stop token included (as vLLM and OpenAI send it).
        if request.params.logprobs is not None:
            output.logprobs = list(update.logprobs)
        self._emit(request, output, now)

    def finish(self, request: Request, reason: FinishReason, error: str | None = None,
               code: str | None = None) -> None:
        """Send a request's last output when it ends from outside the core's stop checks
        (abort, error, timeout, a stop string found by the front): the error, if any, and
        its code."""
        if request.request_id not in self._unfinished:
            return  # already finished
        output = RequestOutput(request.request_id, "", [], finished=True, finish_reason=reason,
                               error=error, error_code=code)
        if request.params.logprobs is not None:
            output.logprobs = []
        self._emit(request, output, time.monotonic())

    def _emit(self, request: Request, output: RequestOutput, now: float) -> None:
        """Fill in what every output carries (counts, timing, the prompt's logprobs with the
        first), count it, and send it."""
        request_id = request.request_id
        output.sample_index = request.sample_index
        output.num_prompt_tokens = request.num_prompt_tokens
        output.num_output_tokens = request.num_output_tokens
        output.num_cached_tokens = request.num_cached_tokens
        if request.thinking is not None:
            output.reasoning_tokens = request.thinking.tokens
        if request.prompt_logprobs is not None and request_id not in self._prompt_logprobs_sent:
            output.prompt_logprobs = list(request.prompt_logprobs)
            self._prompt_logprobs_sent.add(request_id)
        for _ in output.token_ids:  # generated, if not all sent (engine/metrics.py)
            self.metrics.on_token(request, now)
        if output.finished:
            request.finish_reason = output.finish_reason
            self.metrics.on_finish(request, time.monotonic())
            if request.params.logprobs is not None and output.cumulative_logprob is None:
                output.cumulative_logprob = request.cumulative_logprob
            self._unfinished.discard(request_id)
            self._prompt_logprobs_sent.discard(request_id)
        output.timing = timing_of(request)  # the front may end it by a stop string
        request.on_output(output)


def timing_of(request: Request) -> RequestTiming:
    def between(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else end - start

    return RequestTiming(
        queue_time=between(request.arrival_time, request.scheduled_time),
        time_to_first_token=between(request.arrival_time, request.first_token_time),
        decode_time=between(request.first_token_time, request.last_token_time),
        prompt_tokens_computed=request.num_computed_prompt_tokens,
        prompt_tokens_cached=request.num_cached_tokens,
        num_preemptions=request.num_preemptions)
