"""The syntax a model writes its tool calls in: each family was trained on its own.

- `hermes` (Hermes, Qwen2.5, Qwen3): each call a JSON object in tags, on lines of its own,
      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>
  Under `auto` the answer may start as text and go on to calls: the text is the content.
- `llama3_json` (Llama 3.1 to 3.3): the JSON object alone, its arguments under
  "parameters", several separated by "; ", after an optional `<|python_tag|>` where the
  template knows that token:  {"name": "get_weather", "parameters": {"city": "Paris"}}
- `generic`: ours, for templates that show no tool syntax; the tools and the format go in
  the system turn (api/tools/prompt.py):
      <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>

`--tool-call-parser` names one; `auto` (the default) reads the chat template. Each format
says how a call's text is laid out; the grammar that enforces it is api/tools/plan.py's, the
reading back api/tools/calls.py's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema.validators import validator_for

PARSER_NAMES = ("auto", "hermes", "llama3_json", "generic")
PYTHON_TAG = "<|python_tag|>"
# A whole answer that is one call without its tags (see CallFormat.bare_call): optionally
# fenced as code, and while streaming, text that may still become one.
FENCES = ("```json\n", "```\n")
MAY_BE_BARE = re.compile(r'\{\s*("(n(a(m(e("(\s*:?)?)?)?)?)?)?)?$|\{\s*"name"\s*:')


@dataclass(frozen=True)
class CallFormat:
    name: str
    open_tag: str  # before each call ("" for none)
    close_tag: str  # after each call
    pad: str  # between a tag and the JSON object, both sides
    separator: str  # between two calls
    arguments_key: str
    spaced: bool  # JSON as Python's json.dumps writes it (", " and ": "), else compact
    text_first: bool  # under auto, text may come before the calls (else one or the other)
    prefix: str = ""  # may come once before the first call

    @property
    def item_separator(self) -> str:
        return ", " if self.spaced else ","

    @property
    def key_separator(self) -> str:
        return ": " if self.spaced else ":"

    @property
    def opening(self) -> str:
        """What every call starts with, up to its name's string."""
        return f'{self.open_tag}{self.pad}{{"name"{self.key_separator}'

    @property
    def before_arguments(self) -> str:
        """Between the name's string and the arguments' object."""
        return f'{self.item_separator}"{self.arguments_key}"{self.key_separator}'

    @property
    def ending(self) -> str:
        """After the arguments' object."""
        return f"}}{self.pad}{self.close_tag}"

    @property
    def marker(self) -> str:
        """The text that starts a call: where an answer under `auto` turns to calls."""
        return self.open_tag or "{"

    def dumps(self, value: Any) -> str:
        return json.dumps(value, separators=(self.item_separator, self.key_separator),
                          ensure_ascii=False)

    def render(self, name: str, arguments: Any) -> str:
        """One call as the model writes it (`arguments`: decoded JSON, or raw text)."""
        text = arguments if isinstance(arguments, str) else self.dumps(arguments)
        return self.opening + json.dumps(name) + self.before_arguments + text + self.ending

    def starts_calls(self, text: str) -> bool | None:
        """Under `auto`, for a format without text first: whether the answer is calls (True)
        or text (False); None while nothing has come."""
        if not text:
            return None
        starts = [self.marker] + ([self.prefix] if self.prefix else [])
        return any(text.startswith(s[:1]) for s in starts)

    def text_and_calls(self, text: str, finished: bool,
                       names: dict[str, dict] | None = None) -> tuple[str, str | None]:
        """The answer's text part and its calls' part (None: no calls, so far). A text that
        may still be turning into calls keeps its unsure tail (trailing whitespace, a
        partial marker) back until it is known, unless `finished`. `names`: the tools an
        answer under `auto` may call (name -> schema), which it may also call bare
        (bare_call)."""
        if names and self.open_tag:
            bare = self.bare_call(text, finished, names)
            if bare is not None:
                return bare
        if not self.text_first:
            calls = self.starts_calls(text)
            if calls is None:
                return "", None
            return ("", text) if calls else (text, None)
        at = text.find(self.marker)
        if at >= 0:
            return text[:at].rstrip(), text[at:]
        if finished:
            return text, None
        for size in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if text.endswith(self.marker[:size]):
                return text[:-size].rstrip(), None
        return text.rstrip(), None


    def bare_call(self, text: str, finished: bool,
                  tools: dict[str, dict]) -> tuple[str, str | None] | None:
        """An answer under `auto` that is, whole, one JSON object naming one of `tools`
        (name -> its parameters' schema) with arguments that schema accepts ({"name": ...,
        "arguments": {...}}), bare or fenced as code, without the format's tags: small models
        often answer so. Such an answer is that call (in this format's text); while it may
        still become one, nothing is shown yet; None when it is not one (then it is read
        as usual)."""
        body = text.strip()
        for fence in FENCES:
            if body.startswith(fence):
                body = body[len(fence):]
                if finished:
                    if not body.endswith("```"):
                        return None
                    body = body[:-3].strip()
                break
            if not finished and body and fence.startswith(body):
                return "", None  # it may still be a fence
        if not finished:  # (leading whitespace waits for what follows it)
            return ("", None) if not body or MAY_BE_BARE.match(body) else None
        try:
            call = json.loads(body)
        except ValueError:
            return None
        if not isinstance(call, dict) or call.get("name") not in tools or len(call) != 2:
            return None
        arguments = call.get("arguments", call.get("parameters"))
        if not isinstance(arguments, dict) or not validator_for(tools[call["name"]])(
                tools[call["name"]]).is_valid(arguments):
            return None
        return "", self.render(call["name"], arguments)


GENERIC = CallFormat("generic", "<tool_call>", "</tool_call>", "", "\n", "arguments",
                     spaced=False, text_first=False)
HERMES = CallFormat("hermes", "<tool_call>", "</tool_call>", "\n", "\n", "arguments",
                    spaced=True, text_first=True)
LLAMA3_JSON = CallFormat("llama3_json", "", "", "", "; ", "parameters", spaced=True,
                         text_first=False)
FORMATS = {f.name: f for f in (GENERIC, HERMES, LLAMA3_JSON)}


def resolve_format(name: str, template: str | None) -> CallFormat:
    """The format named, or for `auto` the one the chat template shows: `<tool_call>` tags
    (Hermes), a "parameters" object with Llama 3's headers, else ours. ValueError for an
    unknown name."""
    if name not in PARSER_NAMES:
        raise ValueError(f"unknown tool-call parser {name!r}; choose from "
                         f"{', '.join(PARSER_NAMES)}")
    template = template if isinstance(template, str) else ""
    if name == "auto":
        if "tools" not in template:
            name = "generic"
        elif "<tool_call>" in template:
            name = "hermes"
        elif '"parameters"' in template and "<|start_header_id|>" in template:
            name = "llama3_json"
        else:
            name = "generic"
    found = FORMATS[name]
    if found is LLAMA3_JSON and PYTHON_TAG in template:
        return CallFormat(**{**found.__dict__, "prefix": PYTHON_TAG})
    return found
