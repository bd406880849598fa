"""Logprobs as the API shows them: completions' four parallel lists, chat's content entries.

Token strings are each token decoded alone (a character split over tokens shows as U+FFFD
in each part); chat's `bytes` are the token's exact bytes, read from the byte-level BPE
vocabulary when the tokenizer is one (as SmolLM2's is), so the parts of a split character
join back into it. Generated tokens read as the generated text spells them: a special token
(end-of-sequence, a chat marker) is left out of that text, so it reads as "" with no bytes,
in every position and among the alternatives. Every generated token has its entry, the one
that ended the request included. Echoed prompt tokens keep their spelling, since the echoed
prompt is the text as sent. -inf (a token the processed distribution cannot pick) is sent as
-9999.0, as OpenAI does, since JSON has no infinity.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.openai.bodies import ChatTokenLogprob, CompletionLogprobs, TopLogprob
from engine.logprobs import TokenLogprobs

UNLIKELY_LOGPROB = -9999.0


def shown(logprob: float) -> float:
    return max(logprob, UNLIKELY_LOGPROB)


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE (GPT-2's scheme) spells every byte as one printable character: the
    printable Latin-1 bytes as themselves, the other 68 as characters from U+0100 on, in
    byte order. Character -> byte."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    char_of = {b: chr(b) for b in printable}
    for extra, b in enumerate(b for b in range(256) if b not in char_of):
        char_of[b] = chr(0x100 + extra)
    return {c: b for b, c in char_of.items()}


class LogprobFormatter:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self._byte_of = (byte_level_alphabet()
                         if type(decoder).__name__ == "ByteLevel" else None)
        self._texts: dict[int, str] = {}
        self._special: dict[int, bool] = {}

    def text(self, token_id: int) -> str:
        """The token decoded alone, special tokens spelled out (as a prompt shows them)."""
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id])
        return self._texts[token_id]

    def special(self, token_id: int) -> bool:
        """Whether generated text leaves the token out (as the detokenizer does)."""
        if token_id not in self._special:
            self._special[token_id] = bool(self.text(token_id)) and not self.tokenizer.decode(
                [token_id], skip_special_tokens=True)
        return self._special[token_id]

    def output_text(self, token_id: int) -> str:
        """A generated token's string: "" for a special token."""
        return "" if self.special(token_id) else self.text(token_id)

    def bytes(self, token_id: int) -> list[int]:
        """A generated token's bytes (none for a special token)."""
        if self.special(token_id):
            return []
        if self._byte_of is not None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if all(c in self._byte_of for c in piece):
                return [self._byte_of[c] for c in piece]
        return list(self.text(token_id).encode())

    def completion(self, token_ids: Sequence[int], entries: Sequence[TokenLogprobs | None],
                   offset: int, num_echoed: int = 0) -> tuple[CompletionLogprobs, int]:
        """The completions object for these tokens (an entry None: the prompt's first
        token), their text offsets counted from `offset`; and the offset after them. The
        first `num_echoed` tokens are the echoed prompt's, the rest generated."""
        result = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[],
                                    text_offset=[])
        for k, (token_id, entry) in enumerate(zip(token_ids, entries, strict=True)):
            spell = self.text if k < num_echoed else self.output_text
            token = spell(token_id)
            result.tokens.append(token)
            result.text_offset.append(offset)
            offset += len(token)
            if entry is None:
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                continue
            result.token_logprobs.append(shown(entry.logprob))
            top: dict[str, float] = {}
            for t, v in entry.top:  # most likely first: it keeps a string two tokens share
                top.setdefault(spell(t), shown(v))
            top.setdefault(token, shown(entry.logprob))  # the chosen token is always there
            result.top_logprobs.append(top)
        return result, offset

    def chat(self, entries: Sequence[TokenLogprobs]) -> list[ChatTokenLogprob]:
        return [ChatTokenLogprob(
            token=self.output_text(e.token_id), logprob=shown(e.logprob),
            bytes=self.bytes(e.token_id),
            top_logprobs=[TopLogprob(token=self.output_text(t), logprob=shown(v),
                                     bytes=self.bytes(t)) for t, v in e.top])
                for e in entries]
