"""Grammars through llguidance: compile a spec once, give each request its own matcher.

A compiled grammar is an llguidance matcher in its start state; each request gets a deep copy
(about a microsecond) and advances it token by token. Its state depends only on the output
tokens, which a preempted request keeps, so recomputing the request's K/V needs no replay.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import llguidance
import llguidance.hf
import numpy as np


class GrammarKind(StrEnum):
    JSON_SCHEMA = "json"  # value: the schema (a dict)
    JSON_OBJECT = "json_object"  # value: None; any JSON object
    REGEX = "regex"  # value: the pattern
    CHOICE = "choice"  # value: the list of allowed answers
    LARK = "lark"  # value: a grammar in llguidance's lark syntax (built by the server)


class GrammarError(ValueError):
    """A spec that cannot be compiled: invalid, unsupported, or too large."""


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    value: Any = None
    source: str = field(default="", compare=False)  # the request field it came from

    @property
    def key(self) -> str:
        """The cache key: the same constraint however its JSON was spelled."""
        return f"{self.kind}:{json.dumps(self.value, sort_keys=True)}"


# JSON without optional whitespace: a small model, free to add spaces and newlines, may fill
# its whole answer with them; compact JSON cannot stall that way.
JSON_OPTIONS: llguidance.JsonCompileOptions = {"whitespace_flexible": False}


# A lark rule that is one string literal, e.g. `call_open: "<tool_call>"`.
ONE_LITERAL_RULE = re.compile(r'^(\w+): ("(?:[^"\\]|\\.)*")$', re.MULTILINE)


def with_special_tokens(lark: str, tokenizer: llguidance.LLTokenizer | None) -> str:
    """The grammar, where each rule of one literal also takes the one token the tokenizer has
    for that text when llguidance counts that token as special.

    Qwen's tokenizers hold `<tool_call>` as one added token that decodes to its text but that
    llguidance counts as special: a grammar asking for the text "<tool_call>" then offers that
    token (the text's only tokenization) and refuses it when it comes. Naming the token
    (`<[id]>`) as an alternative lets it through; the text it decodes to is the same."""
    if tokenizer is None:
        return lark

    def widen(rule: re.Match) -> str:
        ids = tokenizer.tokenize_str(json.loads(rule[2]))
        if len(ids) != 1 or not tokenizer.is_special_token(ids[0]):
            return rule[0]
        return f"{rule[1]}: {rule[2]} | <[{ids[0]}]>"

    return ONE_LITERAL_RULE.sub(widen, lark)


def grammar_text(spec: GrammarSpec, tokenizer: llguidance.LLTokenizer | None = None) -> str:
    """The llguidance grammar of a spec (not yet checked), for `tokenizer` where given."""
    matcher = llguidance.LLMatcher
    try:
        if spec.kind is GrammarKind.JSON_SCHEMA:
            return matcher.grammar_from_json_schema(spec.value, defaults=JSON_OPTIONS)
        if spec.kind is GrammarKind.JSON_OBJECT:
            return matcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if spec.kind is GrammarKind.REGEX:
            return matcher.grammar_from_regex(spec.value)
        if spec.kind is GrammarKind.LARK:
            return matcher.grammar_from_lark(with_special_tokens(spec.value, tokenizer))
    except (ValueError, RuntimeError, TypeError) as exc:
        raise GrammarError(str(exc)) from exc
    # Lark string literals take JSON's escapes, so json.dumps quotes any choice safely.
    return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.value))


class CompiledGrammar:
    """A grammar checked and built for one tokenizer; `matcher()` starts a request on it."""

    def __init__(self, spec: GrammarSpec, tokenizer: llguidance.LLTokenizer,
                 limits: llguidance.LLParserLimits | None = None) -> None:
        """Compile (slow for a big grammar: llguidance builds it with the GIL released).
        GrammarError for an invalid or oversized grammar, with llguidance's reason."""
        self.spec = spec
        try:
            self._start = llguidance.LLMatcher(tokenizer, grammar_text(spec, tokenizer),
                                               log_level=0, limits=limits)
        except (ValueError, RuntimeError, TypeError) as exc:  # its errors are mostly states
            raise GrammarError(str(exc)) from exc
        if self._start.is_error():
            raise GrammarError(self._start.get_error())
        self.eos_token_id = tokenizer.eos_token
        self.vocab_size = tokenizer.vocab_size

    def matcher(self) -> GrammarState:
        return GrammarState(self._start.deep_copy(), self.eos_token_id, self.vocab_size)


class GrammarState:
    """One request's place in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_id: int,
                 vocab_size: int) -> None:
        self._matcher = matcher
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more (only EOS is left)."""
        return self._matcher.is_stopped()

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; True when the token ends the answer: the EOS a finished
        grammar forces. The mask allowed only grammar tokens, so a refused one (an error
        state) means a bug; it too ends the answer, rather than run on unconstrained."""
        if self.finished:
            return True
        return not self._matcher.consume_token(token)

    def allowed_bits(self) -> np.ndarray:
        """The tokens allowed next, one bit each (bit i of byte i // 8, little-endian), as
        uint8. A matcher in an error state allows only EOS, which ends the request."""
        if self._matcher.is_error():
            bits = np.zeros(((self.vocab_size + 31) // 32 * 4,), dtype=np.uint8)
            bits[self.eos_token_id // 8] = 1 << (self.eos_token_id % 8)
            return bits
        return np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)


def llguidance_tokenizer(hf_tokenizer: Any) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face tokenizer (a fraction of a second to build)."""
    return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=len(hf_tokenizer))
