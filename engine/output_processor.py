"""From new token ids to what a client receives: one RequestOutput per request per step
through the request's callback, with its tokens, logprobs and counts, and the metrics.

Text and stop strings are a SampleText's (engine/detokenizer.py). In-process, this
processor runs one per request (`detokenize=True`); in the engine core process
(engine/process/loop.py) it does not: its outputs carry token ids and no text, each with the
request's timing so far, and the API process makes the text (engine/process/outputs.py)."""

from __future__ import annotations

import time

from engine.detokenizer import SampleText
from engine.metrics import EngineMetrics
from engine.request import FinishReason, Request, RequestOutput, RequestTiming
from engine.step_types import RequestUpdate


class OutputProcessor:
    def __init__(self, tokenizer, metrics: EngineMetrics, detokenize: bool = True) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.detokenize = detokenize
        # Each unfinished request's text (None: made elsewhere), and whether its prompt's
        # logprobs went out.
        self._texts: dict[str, SampleText | None] = {}
        self._prompt_logprobs_sent: set[str] = set()

    def add(self, request: Request) -> None:
        params = request.params
        self._texts[request.request_id] = (
            SampleText(self.tokenizer, request.prompt_token_ids, params.stop, params.min_tokens)
            if self.detokenize else None)

    def process(self, update: RequestUpdate, now: float) -> FinishReason | None:
        """Hand out one request's new tokens.

        A stop token or length may have ended the request already (update.finish_reason):
        this sends its last output. A stop string found here ends it too: then the reason
        is returned, and the caller must still unseat the request."""
        request = update.request
        output = RequestOutput(request.request_id, "", list(update.new_token_ids),
                               finished=update.finish_reason is not None,
                               finish_reason=update.finish_reason)
        # One entry per token sent, the stop token included (as vLLM and OpenAI send it).
        if request.params.logprobs is not None:
            output.logprobs = list(update.logprobs)
        ended_here = self._emit(request, output, now)
        return FinishReason.STOP if ended_here else None

    def finish(self, request: Request, reason: FinishReason, error: str | None = None,
               code: str | None = None) -> None:
        """Send a request's last output when it ends from outside the core's stop checks
        (abort, error, timeout): the rest of its text, or the error (and its code)."""
        if request.request_id not in self._texts:
            return  # already finished
        output = RequestOutput(request.request_id, "", [], finished=True, finish_reason=reason,
                               error=error, error_code=code)
        if request.params.logprobs is not None:
            output.logprobs = []
        self._emit(request, output, time.monotonic())

    def _emit(self, request: Request, output: RequestOutput, now: float) -> bool:
        """Fill in what every output carries (text, counts, the prompt's logprobs with the
        first), count it, and send it; True if a stop string ended the request here."""
        request_id = request.request_id
        output.sample_index = request.sample_index
        output.num_prompt_tokens = request.num_prompt_tokens
        output.num_output_tokens = request.num_output_tokens
        output.num_cached_tokens = request.num_cached_tokens
        if request.prompt_logprobs is not None and request_id not in self._prompt_logprobs_sent:
            output.prompt_logprobs = list(request.prompt_logprobs)
            self._prompt_logprobs_sent.add(request_id)
        for _ in output.token_ids:  # generated, if not all sent (engine/metrics.py)
            self.metrics.on_token(request, now)
        text = self._texts[request_id]
        ended_here = text is not None and text.apply(output)
        if ended_here:  # tokens after the stop string are dropped
            del request.token_ids[request.num_prompt_tokens + output.num_output_tokens:]
        if output.finished:
            request.finish_reason = output.finish_reason
            self.metrics.on_finish(request, time.monotonic())
            if request.params.logprobs is not None and output.cumulative_logprob is None:
                output.cumulative_logprob = request.cumulative_logprob
            del self._texts[request_id]
            self._prompt_logprobs_sent.discard(request_id)
        if output.finished or text is None:  # the API process may end it by a stop string
            output.timing = timing_of(request)
        request.on_output(output)
        return ended_here


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
