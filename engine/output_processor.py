"""From new token ids to what a client receives: text (stop strings included), logprobs,
metrics, and one RequestOutput per request per step through the request's callback."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.detokenizer import IncrementalDetokenizer
from engine.logprobs import TokenLogprobs
from engine.metrics import EngineMetrics
from engine.request import FinishReason, Request, RequestOutput, RequestTiming
from engine.step_types import RequestUpdate


@dataclass
class Tracked:
    """What the processor keeps per unfinished request."""

    detok: IncrementalDetokenizer
    prompt_logprobs_sent: bool = False


class OutputProcessor:
    def __init__(self, tokenizer, metrics: EngineMetrics) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics
        self._tracked: dict[str, Tracked] = {}

    def add(self, request: Request) -> None:
        self._tracked[request.request_id] = Tracked(IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, request.params.stop,
            request.params.min_tokens))

    def process(self, update: RequestUpdate, now: float) -> FinishReason | None:
        """Detokenize one request's new tokens and hand them out.

        A stop token or length may have ended the request already (update.finish_reason):
        this sends its last output. A stop string found here ends it too: then the reason
        is returned, and the caller must still unseat the request."""
        request, new = update.request, update.new_token_ids
        detok = self._tracked[request.request_id].detok
        first = request.num_tokens - len(new)  # where new[0] sits in request.token_ids
        reason = update.finish_reason
        for i in range(len(new)):
            self.metrics.on_token(request, now)
            if i == len(new) - 1 and update.ended_by_stop_token:
                break  # the stop token is not part of the text (its logprob is sent)
            end = first + i + 1
            detok.add(request.token_ids if end == request.num_tokens
                      else request.token_ids[:end])
            if detok.stopped:
                new = new[:i + 1]  # tokens after a stop string (several per step) are dropped
                del request.token_ids[end:]
                reason = FinishReason.STOP
                break
        # One entry per token sent, the stop token included (as vLLM and OpenAI send it).
        logprobs = (update.logprobs[:len(new)] if request.params.logprobs is not None
                    else None)
        if reason is None:
            self._send(request, RequestOutput(request.request_id, detok.take(final=False),
                                              list(new)), logprobs)
            return None
        self.finish(request, reason, new_token_ids=list(new), logprobs=logprobs)
        return reason if update.finish_reason is None else None

    def finish(self, request: Request, reason: FinishReason, error: str | None = None,
               new_token_ids: list[int] | None = None,
               logprobs: list[TokenLogprobs] | None = None, code: str | None = None) -> None:
        """Send a request's last output: the rest of its text and tokens, or the error (and
        its code)."""
        tracked = self._tracked.get(request.request_id)
        if tracked is None:
            return  # already finished
        request.finish_reason = reason
        now = time.monotonic()
        self.metrics.on_finish(request, now)
        text = tracked.detok.take(final=True) if error is None else ""
        output = RequestOutput(
            request.request_id, text, new_token_ids or [], finished=True, finish_reason=reason,
            error=error, error_code=code, cumulative_logprob=(request.cumulative_logprob
                                if request.params.logprobs is not None else None),
            timing=timing_of(request), stop_string=tracked.detok.matched_stop)
        if request.params.logprobs is not None and logprobs is None:
            logprobs = []
        self._send(request, output, logprobs)
        del self._tracked[request.request_id]

    def _send(self, request: Request, output: RequestOutput,
              logprobs: list[TokenLogprobs] | None) -> None:
        """Fill in what every output carries (and the prompt's logprobs, with the first)."""
        tracked = self._tracked[request.request_id]
        output.sample_index = request.sample_index
        output.num_prompt_tokens = request.num_prompt_tokens
        output.num_output_tokens = request.num_output_tokens
        output.num_cached_tokens = request.num_cached_tokens
        output.logprobs = logprobs
        if request.prompt_logprobs is not None and not tracked.prompt_logprobs_sent:
            output.prompt_logprobs = list(request.prompt_logprobs)
            tracked.prompt_logprobs_sent = True
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
