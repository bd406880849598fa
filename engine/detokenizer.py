"""Incremental detokenization with stop strings, and a sample's text from its tokens.

Byte-level BPE can split one character over several tokens, so text is only
released once the newest tokens decode to whole characters (no trailing U+FFFD).
Stop strings can straddle tokens, so the last len(longest stop) - 1 characters are
held back until the request ends. As in vLLM, stop strings count only once more than
min_tokens tokens are out, and then only in text that arrived from then on.

With a Hugging Face tokenizer backed by the Rust `tokenizers` library (and no clean-up of
spaces after decoding), each new token goes to that library's own incremental decoder,
`DecodeStream`, in one call; any other tokenizer is asked to decode the window before and
after the new token, the same rule in Python. The text is the same either way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from engine.request import FinishReason, RequestOutput

log = logging.getLogger("nano_vllm.detokenizer")

# Decoding a few tokens before the new ones keeps spacing right (many tokenizers
# render a leading space only when the token is not first).
CONTEXT_TOKENS = 5


def rust_tokenizer(tokenizer: Any) -> Tokenizer | None:
    """The `tokenizers.Tokenizer` whose decode is exactly `tokenizer.decode`, or None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer) and not getattr(tokenizer,
                                                      "clean_up_tokenization_spaces", True):
        return backend
    return None


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str],
                 min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.num_prompt_tokens = len(prompt_token_ids)
        self.min_tokens = min_tokens
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.prefix_offset = max(len(prompt_token_ids) - CONTEXT_TOKENS, 0)
        self.read_offset = len(prompt_token_ids)
        self.text = ""  # all output text so far (cut at a stop string once found)
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False
        self.matched_stop: str | None = None  # the stop string that ended the text
        self._backend = rust_tokenizer(tokenizer)
        self._stream = None if self._backend is None else DecodeStream(
            ids=list(prompt_token_ids[self.prefix_offset:]), skip_special_tokens=True)
        self._fed = len(prompt_token_ids)  # tokens the stream has had

    def add(self, token_ids: Sequence[int]) -> None:
        """token_ids is the whole sequence (prompt + output) after a new token."""
        new_text = self._next_text(token_ids)
        if new_text is not None:
            start = max(len(self.text) - self.hold_back - 1, 0)
            self.text += new_text
            self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
            if len(token_ids) - self.num_prompt_tokens > self.min_tokens:
                self._find_stop(start)

    def _next_text(self, token_ids: Sequence[int]) -> str | None:
        """The text the newest token completes, or None while it ends inside a character."""
        if self._stream is not None:
            new, self._fed = token_ids[self._fed:], len(token_ids)
            if not new:
                return None
            try:
                return self._stream.step(self._backend, new[0] if len(new) == 1 else list(new))
            except Exception as exc:  # e.g. decoding changed the start of its window
                log.warning("detokenizer: the tokenizers stream failed (%s); decoding this "
                            "request's windows in Python from here on", exc)
                self._stream = None  # the offsets below are kept up to date for this
        before = self._decode(token_ids[self.prefix_offset:self.read_offset])
        after = self._decode(token_ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            return after[len(before):]
        return None

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _find_stop(self, search_from: int) -> None:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            at, self.matched_stop = min(hits, key=lambda hit: hit[0])  # the first to appear
            self.text = self.text[:at]
            self.stopped = True

    def take(self, final: bool) -> str:
        """Text not yet handed out; while unfinished, keep back what may begin a stop string."""
        end = len(self.text) if final or self.stopped else max(len(self.text) - self.hold_back,
                                                              self.emitted)
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta


class SampleText:
    """One sample's text, made from the token ids the engine core hands out: the one place
    stop strings are found: by the engine's front in either mode (engine/text_outputs.py), on
    the engine thread in-process, in the API process for a core in its own process.

    The core ends a request only by a stop token (EOS, stop_token_ids, a finished grammar)
    or by length; its output then says so, and with a stop token the last new token is that
    token, whose text is not part of the output's. A stop string found here ends the sample
    at the token that completed it: the tokens after it (several per step with speculative
    decoding) are dropped, with their logprobs."""

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str],
                 min_tokens: int = 0) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, stop, min_tokens)
        self.token_ids = list(prompt_token_ids)  # prompt, then every output token kept
        self.cumulative_logprob = 0.0  # of the tokens kept, when logprobs come

    def apply(self, output: RequestOutput) -> bool:
        """Fill in the text of `output`, the core's next for this sample; on a stop string,
        cut its tokens and logprobs after it and make it the last (finish reason stop).
        True if the stop string ended a sample the core has not ended: the caller must
        end it there."""
        new = output.token_ids
        first = len(self.token_ids)
        self.token_ids += new
        stop_token = output.finish_reason is FinishReason.STOP and bool(new)
        kept = len(new)
        for i in range(len(new) - stop_token):
            end = first + i + 1
            self.detok.add(self.token_ids if end == len(self.token_ids)
                           else self.token_ids[:end])
            if self.detok.stopped:
                kept = i + 1
                break
        if output.logprobs is not None:
            for entry in output.logprobs[:kept]:
                self.cumulative_logprob += entry.logprob
        if not self.detok.stopped:
            output.text = self.detok.take(final=output.finished) if output.error is None else ""
            return False
        del self.token_ids[first + kept:]
        ended_here = not output.finished
        output.num_output_tokens -= len(new) - kept
        output.token_ids = new[:kept]
        if output.logprobs is not None:
            output.logprobs = output.logprobs[:kept]
            output.cumulative_logprob = self.cumulative_logprob
        output.finished, output.finish_reason = True, FinishReason.STOP
        output.stop_string = self.detok.matched_stop
        output.text = self.detok.take(final=True)
        return ended_here
