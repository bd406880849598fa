"""Thinking apart from the answer: the tags a model thinks between, and an output's text
split into its reasoning and its content, the same way whole or streamed.

Parsers (`--reasoning-parser`, default `auto`):
- `qwen3`: `<think>` ... `</think>`, opened by the output itself (Qwen3) or at the end of
  the prompt by the chat template (DeepSeek-R1's distills, Qwen3's thinking-only models):
  the rendered prompt says which, request by request;
- `deepseek_r1`: the same tags, the output taken to start inside the span whatever the
  prompt shows (for templates that open it out of sight);
- `none`: no thinking; the whole output is content.
`auto` takes `qwen3` where the chat template writes both tags, else `none`.

The split is a function of the text so far, so a stream sends each part's growth as deltas
and the deltas join into exactly what the whole answer gives: whitespace around the
reasoning, and the whitespace after the close tag, are left out, and a tail that may still
become a tag is held back until it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engine.thinking import ThinkingParams

PARSER_NAMES = ("auto", "qwen3", "deepseek_r1", "none")
PromptThinking = Literal["open", "done", "free"]  # ReasoningParser.prompt_state
OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    open: str = OPEN
    close: str = CLOSE
    always_open: bool = False  # the output starts inside the span, whatever the prompt shows
    after_close: str = "\n\n"  # what the template puts after the close tag

    def prompt_state(self, prompt: str) -> PromptThinking:
        """Where the output starts: inside a span the prompt opened ("open"), after one the
        prompt closed at its very end, which is thinking switched off ("done": Qwen3's
        enable_thinking false), or free to open one ("free")."""
        if self.always_open:
            return "open"
        opened = prompt.rfind(self.open)
        if opened >= 0 and self.close not in prompt[opened:]:
            return "open"
        return "done" if prompt.rstrip().endswith(self.close) else "free"

    def engine_params(self, tokenizer: Any, starts_open: bool,
                      budget: int | None) -> ThinkingParams:
        """The tags as the engine follows them (engine/thinking.py), with the budget."""
        def ids(text: str) -> list[int]:
            return tokenizer(text, add_special_tokens=False).input_ids

        opening = ids(self.open)
        return ThinkingParams(opening[0] if len(opening) == 1 else None, ids(self.close),
                              ids(self.close + self.after_close), starts_open, budget)


def resolve_parser(name: str, template: str | None) -> ReasoningParser | None:
    """The parser named (or, for `auto`, the one the chat template calls for); None: none.
    ValueError for an unknown name."""
    if name not in PARSER_NAMES:
        raise ValueError(f"unknown reasoning parser {name!r}; choose from "
                         f"{', '.join(PARSER_NAMES)}")
    if name == "none" or (name == "auto" and not template_thinks(template)):
        return None
    return ReasoningParser("qwen3" if name == "auto" else name,
                           always_open=name == "deepseek_r1",
                           after_close=text_after_close(template, CLOSE))


def template_thinks(template: str | None) -> bool:
    return isinstance(template, str) and OPEN in template and CLOSE in template


def text_after_close(template: str | None, close: str) -> str:
    """The newlines the template writes right after the close tag (Qwen3's two), read from
    its literals (`</think>\\n\\n`, escaped or not): the most found after any of them; two
    where it shows none."""
    most = 0
    for after in (template or "").split(close)[1:]:
        newlines, rest = 0, after
        while rest[:1] == "\n" or rest[:2] == "\\n":
            rest = rest[1:] if rest[:1] == "\n" else rest[2:]
            newlines += 1
        most = max(most, newlines)
    return "\n" * (most or 2)


@dataclass
class Split:
    reasoning: str | None  # None: the output does not think
    content: str
    thinking: bool  # still inside the span (or not yet known whether it opens one)


def held_back(text: str, tag: str) -> str:
    """`text` less a tail that is the start of `tag` (it may still become the tag)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return text[:-size]
    return text


def split(parser: ReasoningParser | None, text: str, starts_open: bool,
          finished: bool) -> Split:
    """The output's reasoning and content so far (`finished`: `text` is all of it)."""
    if parser is None:
        return Split(None, text, False)
    start = 0
    if text.startswith(parser.open):
        start = len(parser.open)
    elif parser.open.startswith(text) and not finished:
        return Split("", "", True)  # it may still be the open tag
    elif not starts_open:
        return Split(None, text, False)
    end = text.find(parser.close, start)
    if end >= 0:
        return Split(text[start:end].strip(), text[end + len(parser.close):].lstrip(), False)
    reasoning = text[start:]
    if finished:
        return Split(reasoning.strip(), "", False)
    return Split(held_back(reasoning, parser.close).strip(), "", True)


@dataclass
class SplitStream:
    """What one streamed choice has sent of each part."""

    reasoning: int = 0
    content: int = 0

    def deltas(self, reasoning_now: str | None, content_now: str) -> tuple[str, str]:
        """The reasoning and content that came since the last call (given each part so
        far)."""
        reasoning = (reasoning_now or "")[self.reasoning:]
        content = content_now[self.content:]
        self.reasoning += len(reasoning)
        self.content += len(content)
        return reasoning, content
