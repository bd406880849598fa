"""Incremental detokenization with stop strings.

Byte-level BPE can split one character over several tokens, so text is only
released once the newest tokens decode to whole characters (no trailing U+FFFD).
Stop strings can straddle tokens, so the last len(longest stop) - 1 characters are
held back until the request ends. As in vLLM, stop strings count only once more than
min_tokens tokens are out, and then only in text that arrived from then on.
"""

from __future__ import annotations

from collections.abc import Sequence

# Decoding a few tokens before the new ones keeps spacing right (many tokenizers
# render a leading space only when the token is not first).
CONTEXT_TOKENS = 5


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

    def add(self, token_ids: Sequence[int]) -> None:
        """token_ids is the whole sequence (prompt + output) after a new token."""
        def decode(ids: Sequence[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        before = decode(token_ids[self.prefix_offset:self.read_offset])
        after = decode(token_ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            start = max(len(self.text) - self.hold_back - 1, 0)
            self.text += after[len(before):]
            self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
            if len(token_ids) - self.num_prompt_tokens > self.min_tokens:
                self._find_stop(start)

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
