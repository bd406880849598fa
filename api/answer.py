"""A chat answer read into its parts: the thinking, the text, the tool calls.

The model's conventions (ChatFormat: its reasoning parser, its tool-call syntax, the
server's default thinking budget) are fixed when the server starts, from its chat template
or the flags. Each answer is then read from its text so far by AnswerReader, the same way
for a whole answer and for each step of a stream, on every surface (chat completions, the
Responses API, Anthropic's Messages):

    text --reasoning parser (api/thinking.py)--> reasoning | rest
    rest --call format (api/tools/formats.py)--> content   | calls (api/tools/calls.py)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from api.thinking import PARSER_NAMES as REASONING_PARSERS
from api.thinking import PromptThinking, ReasoningParser, resolve_parser, split
from api.tools.calls import Scan, scan
from api.tools.formats import GENERIC, CallFormat, resolve_format
from api.tools.formats import PARSER_NAMES as CALL_PARSERS


@dataclass(frozen=True)
class ChatFormat:
    reasoning: ReasoningParser | None = None  # None: the model does not think
    calls: CallFormat = GENERIC
    thinking_budget: int | None = None  # a request's default (None: unbounded)

    @classmethod
    def of(cls, tokenizer: Any, reasoning_parser: str = "auto",
           tool_call_parser: str = "auto", thinking_budget: int | None = None) -> ChatFormat:
        """The conventions named, or read from the tokenizer's chat template (`auto`).
        ValueError for an unknown name or a negative budget."""
        check_budget(thinking_budget)
        template = getattr(tokenizer, "chat_template", None)
        return cls(resolve_parser(reasoning_parser, template),
                   resolve_format(tool_call_parser, template), thinking_budget)

    def describe(self) -> str:
        """For the startup line."""
        thinking = ("no thinking" if self.reasoning is None else
                    f"thinking parsed as {self.reasoning.name}"
                    + (f" (budget {self.thinking_budget} tokens)"
                       if self.thinking_budget is not None else ""))
        return f"{thinking}; tool calls in {self.calls.name} syntax"


def check_budget(thinking_budget: int | None) -> None:
    """ValueError for a negative --thinking-token-budget (checked before a model loads)."""
    if thinking_budget is not None and thinking_budget < 0:
        raise ValueError("--thinking-token-budget cannot be negative")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reasoning-parser", default="auto", choices=REASONING_PARSERS,
                        help="how a thinking model's reasoning is told apart from its answer "
                             "(auto: from the chat template; qwen3: <think>...</think>; "
                             "deepseek_r1: the same, the output starting inside; none)")
    parser.add_argument("--tool-call-parser", default="auto", choices=CALL_PARSERS,
                        help="the syntax the model writes tool calls in (auto: from the chat "
                             "template; hermes: <tool_call> tags; llama3_json; generic: "
                             "ours, for templates without tools)")
    parser.add_argument("--thinking-token-budget", type=int, default=None,
                        help="thinking tokens a request may use before the server ends its "
                             "thinking, unless the request sets its own (default: no bound)")


def chat_format_from_args(args: argparse.Namespace, tokenizer: Any) -> ChatFormat:
    return ChatFormat.of(tokenizer, args.reasoning_parser, args.tool_call_parser,
                         args.thinking_token_budget)


@dataclass
class Answer:
    reasoning: str | None  # None: the answer does not think
    content: str  # the text, without thinking or calls
    calls: str | None  # the calls' text (None: no calls, so far)
    thinking: bool  # still inside the thinking, or not yet known whether it opens it


@dataclass(frozen=True)
class AnswerReader:
    """How to read one prompt's answers."""

    form: ChatFormat
    may_call: bool  # tools that may be called were offered
    thinking: PromptThinking  # how the prompt leaves the thinking (api/thinking.py)
    bare_tools: dict[str, dict] | None = None  # under `auto`: name -> schema, callable bare

    def read(self, text: str, finished: bool) -> Answer:
        """The parts of the answer so far (`finished`: `text` is all of it)."""
        parser = None if self.thinking == "done" else self.form.reasoning
        part = split(parser, text, self.thinking == "open", finished)
        if part.thinking or not self.may_call:
            return Answer(part.reasoning, part.content, None, part.thinking)
        content, calls = self.form.calls.text_and_calls(part.content, finished,
                                                        self.bare_tools)
        return Answer(part.reasoning, content, calls, False)

    def scan(self, calls: str) -> Scan:
        return scan(calls, self.form.calls)
