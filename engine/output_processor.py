"""From new token ids to what a client receives: text (stop strings included), metrics,
and one RequestOutput per request per step through the request's callback."""

from __future__ import annotations

import time

from engine.detokenizer import IncrementalDetokenizer
from engine.metrics import EngineMetrics
from engine.request import FinishReason, Request, RequestOutput, RequestUpdate


class OutputProcessor:
    def __init__(self, tokenizer, metrics: EngineMetrics) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics
        self._detok: dict[str, IncrementalDetokenizer] = {}

    def add(self, request: Request) -> None:
        self._detok[request.request_id] = IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, request.params.stop)

    def process(self, update: RequestUpdate, now: float) -> FinishReason | None:
        """Detokenize one request's new tokens and hand them out.

        A stop token or length may have ended the request already (update.finish_reason):
        this sends its last output. A stop string found here ends it too: then the reason
        is returned, and the caller must still unseat the request."""
        request, new = update.request, update.new_token_ids
        detok = self._detok[request.request_id]
        first = request.num_tokens - len(new)  # where new[0] sits in request.token_ids
        reason = update.finish_reason
        for i in range(len(new)):
            self.metrics.on_token(request, now)
            if i == len(new) - 1 and update.ended_by_stop_token:
                break  # the stop token itself is not part of the text
            end = first + i + 1
            detok.add(request.token_ids if end == request.num_tokens
                      else request.token_ids[:end])
            if detok.stopped:
                new = new[:i + 1]  # tokens after a stop string (several per step) are dropped
                del request.token_ids[end:]
                reason = FinishReason.STOP
                break
        if reason is None:
            request.on_output(RequestOutput(request.request_id, detok.take(final=False),
                                            list(new),
                                            num_output_tokens=request.num_output_tokens))
            return None
        self.finish(request, reason, new_token_ids=list(new))
        return reason if update.finish_reason is None else None

    def finish(self, request: Request, reason: FinishReason, error: str | None = None,
               new_token_ids: list[int] | None = None) -> None:
        """Send a request's last output: the rest of its text and tokens, or the error."""
        detok = self._detok.pop(request.request_id, None)
        if detok is None:
            return  # already finished
        request.finish_reason = reason
        self.metrics.on_finish(request, time.monotonic())
        request.on_output(RequestOutput(
            request.request_id, detok.take(final=True) if error is None else "",
            new_token_ids or [], finished=True, finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens, error=error))
