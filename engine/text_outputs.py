"""The front's record of the requests it has handed to an engine loop and not yet seen end,
and the outputs its clients get for them: the same for both engine fronts (the thread,
engine/batch_engine.py, and the client of an engine core process, engine/process/client.py).

The loop's outputs carry token ids and no text. Here each sample's text is made and its
stop strings found (engine/detokenizer.py's SampleText), each output goes to its request's
`on_output`, and each sample's last output is counted by reason (request_success_total,
engine/metrics.py's FinishMetrics).

A sample a stop string ends is finished here for its client, and the loop is told to end
it too (`end_sample`; an EndSample message to a core process), which frees its blocks.
Until the loop takes that in it may still send outputs for the sample, its own end
included (by length, say, in the step it was already running): they are dropped, so a
client gets exactly one last output per sample. A stop string that completes on the very
token with which the core ends the sample (its max_tokens-th) ends it in that same
output, with reason stop; the core has ended it already, so nothing is sent back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from engine.detokenizer import SampleText
from engine.metrics import FinishMetrics
from engine.request import ENGINE_FAILED, FinishReason, Request, RequestOutput


@dataclass
class _InFlight:
    request: Request
    on_output: Callable[[RequestOutput], None]  # the client's, kept when the front wraps it
    texts: dict[int, SampleText]  # each sample still to end, by its index


class TextOutputs:
    """`add` on the API's threads; `deliver` and `fail_all` where the front receives the
    loop's outputs (the engine thread, or the client's receiver), which alone calls the
    requests' `on_output`."""

    def __init__(self, tokenizer, end_sample: Callable[[str], None]) -> None:
        """`end_sample(sample_id)`: tell the core a stop string ended that sample here."""
        self.tokenizer = tokenizer
        self.finishes = FinishMetrics()
        self._end_sample = end_sample
        self._lock = threading.Lock()  # guards _requests and each entry's texts
        self._requests: dict[str, _InFlight] = {}

    def add(self, request: Request) -> None:
        """Track a request, each of its samples with a text of its own; before it is sent,
        since the core's first outputs for it may come back at once."""
        params = request.params
        texts = {index: SampleText(self.tokenizer, request.prompt_token_ids, params.stop,
                                   params.min_tokens) for index in range(params.n)}
        with self._lock:
            self._requests[request.request_id] = _InFlight(request, request.on_output, texts)

    def forget(self, request_id: str) -> None:
        """Stop tracking a request that was never handed over (its client is told why)."""
        with self._lock:
            self._requests.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        """Whether a sample of this request (the id it was added with) is still to end."""
        return request_id in self._requests

    @property
    def num_samples(self) -> int:
        """Samples of every request tracked here that have not ended."""
        with self._lock:
            return sum(len(entry.texts) for entry in self._requests.values())

    def deliver(self, outputs: list[tuple[str, RequestOutput]]) -> None:
        """A Report's outputs (each with the id its request was added with): make their text
        and hand them out, dropping those of samples that have ended here already."""
        for request_id, output in outputs:
            entry = self._requests.get(request_id)
            text = None if entry is None else entry.texts.get(output.sample_index)
            if entry is None or text is None:
                continue  # ended here already (by a stop string), or failed
            if text.apply(output):  # a stop string: the core is told first, to free sooner
                self._end_sample(output.request_id)  # the sample's own id
            entry.on_output(output)
            if output.finished:
                self._ended(request_id, entry, output)

    def _ended(self, request_id: str, entry: _InFlight, output: RequestOutput) -> None:
        self.finishes.on_finish(output.finish_reason)
        with self._lock:
            del entry.texts[output.sample_index]
            if not entry.texts:
                del self._requests[request_id]

    def fail_all(self, error: str) -> None:
        """The core is gone: end every sample still in flight with `error` (ENGINE_FAILED)."""
        with self._lock:
            requests, self._requests = self._requests, {}
        for entry in requests.values():
            for index in sorted(entry.texts):
                request_id = entry.request.request_id + (f"#{index}" if index else "")
                entry.on_output(RequestOutput(
                    request_id, "", [], finished=True, finish_reason=FinishReason.ERROR,
                    error=error, error_code=ENGINE_FAILED, sample_index=index))
                self.finishes.on_finish(FinishReason.ERROR)
