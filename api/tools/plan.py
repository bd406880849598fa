"""Function tools on /v1/chat/completions: what a request offers and asks, read into a
ToolPlan (tools, tool_choice, parallel_tool_calls, or the legacy functions/function_call),
with a 400 naming the field for anything malformed.

Calls are written in the model's own syntax (api/tools/formats.py). `required` and a named
choice constrain the answer to such calls with a grammar (llguidance's lark, the arguments
through its JSON-schema support, laid out as the format lays out JSON); `auto` allows free
text too: before the calls where the format allows that (Hermes), else instead of them (free
text then cannot start as a call does); `none` renders no tools and adds no grammar.
Prompting and reading the answer back are api/tools/prompt.py's and api/tools/calls.py's.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from api.errors import APIError
from api.tools.formats import GENERIC, CallFormat
from engine.structured.grammar import GrammarKind, GrammarSpec

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None
    parameters: dict[str, Any]  # a JSON schema for the arguments (an object)

    def as_json(self) -> dict[str, Any]:
        """The tool as the prompt shows it."""
        shown: dict[str, Any] = {"name": self.name}
        if self.description:
            shown["description"] = self.description
        shown["parameters"] = self.parameters
        return shown


@dataclass(frozen=True)
class ToolPlan:
    tools: list[FunctionTool]  # offered
    mode: Mode
    chosen: FunctionTool | None  # the named choice
    parallel: bool  # more than one call per answer allowed
    source: str  # the field the tools came from: "tools" or "functions"

    @property
    def callable(self) -> list[FunctionTool]:
        """The tools an answer may call."""
        if self.mode == "none":
            return []
        return [self.chosen] if self.chosen else self.tools

    @property
    def may_call(self) -> bool:
        return bool(self.callable)

    def grammar_spec(self, form: CallFormat = GENERIC) -> GrammarSpec | None:
        """The constraint on the answer, calls written in `form`; None under `none`."""
        if not self.may_call:
            return None
        return GrammarSpec(GrammarKind.LARK, call_grammar(
            self.callable, self.parallel, free_text=self.mode == "auto", form=form),
            self.source)


def free_text_lexeme(form: CallFormat) -> str:
    """Free text under `auto`: anything without the call marker, where text may come first;
    else anything not starting as a call does, so the first character tells them apart."""
    if form.text_first:
        marker = "".join(f"\\x{ord(c):02x}" if ord(c) < 128 else c for c in form.marker)
        return rf"/(?s:.+)/ & ~/(?s:.*){marker}(?s:.*)/"
    starts = "".join(sorted({form.marker[0], *form.prefix[:1]}))
    return rf"/[^{re.escape(starts)}][\s\S]*/"


def call_grammar(tools: list[FunctionTool], parallel: bool, free_text: bool,
                 form: CallFormat = GENERIC) -> str:
    """A lark grammar: one call (or several) to one of `tools` in `form`, or under
    `free_text` also text (before the calls, or instead of them: free_text_lexeme)."""
    separator = json.dumps(form.separator)
    calls = f"call ({separator} call)*" if parallel else "call"
    lines = [("start: TEXT | TEXT? calls" if form.text_first else "start: TEXT | calls")
             if free_text else "start: calls",
             f"calls: call_prefix? {calls}" if form.prefix else f"calls: {calls}",
             "call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    # Rules of one literal each: where the tokenizer holds a tag as one token of its own
    # (Qwen's <tool_call>, Llama's <|python_tag|>), the grammar accepts that token too.
    tags = {"call_prefix": form.prefix, "call_open": form.open_tag, "call_close": form.close_tag}
    lines += [f"{rule}: {json.dumps(text)}" for rule, text in tags.items() if text]
    head = form.opening.removeprefix(form.open_tag)
    tail = form.ending.removesuffix(form.close_tag)
    for i, tool in enumerate(tools):
        schema = {**tool.parameters, "x-guidance": {
            "whitespace_flexible": False, "item_separator": form.item_separator,
            "key_separator": form.key_separator}}
        parts = ["call_open"] if form.open_tag else []
        parts += [json.dumps(head + json.dumps(tool.name) + form.before_arguments), f"args_{i}",
                  json.dumps(tail)] + (["call_close"] if form.close_tag else [])
        lines += [f"call_{i}: {' '.join(parts)}", f"args_{i}: %json {json.dumps(schema)}"]
    if free_text:
        lines.append(f"TEXT: {free_text_lexeme(form)}")
    return "\n".join(lines)


def tool_plan(body: Any) -> ToolPlan | None:
    """What the body offers and asks (None: no tools and no choice); APIError naming the
    field when malformed."""
    if body.tools is not None and body.functions is not None:
        raise APIError("Send tools or the legacy functions, not both.", "functions")
    if body.tool_choice is not None and body.function_call is not None:
        raise APIError("Send tool_choice or the legacy function_call, not both.",
                       "function_call")
    if body.functions is not None:
        source, tools = "functions", read_functions(body.functions, "functions")
    else:
        source, tools = "tools", read_tools(body.tools or [])
    if body.function_call is not None:
        choice_field, choice = "function_call", legacy_choice(body.function_call)
    else:
        choice_field, choice = "tool_choice", body.tool_choice
    if not tools and choice is None:
        return None
    mode, chosen = read_choice(choice, tools, choice_field)
    # The legacy form answers with one call, as OpenAI's did.
    parallel = body.parallel_tool_calls is not False and source == "tools"
    return ToolPlan(tools, mode, chosen, parallel, source)


def read_tools(value: list[Any]) -> list[FunctionTool]:
    functions = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise APIError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                           "{...}}; only function tools are offered.", "tools")
        functions.append(tool.get("function"))
    return read_functions(functions, "tools")


def read_functions(value: list[Any], field: str,
                   schema_key: str = "parameters") -> list[FunctionTool]:
    """Each function's name, description and arguments' schema (under `schema_key`: Anthropic
    calls it input_schema)."""
    tools: list[FunctionTool] = []
    for i, function in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(function, dict):
            raise APIError(f"{where} must be a function: {{name, description, {schema_key}}}.",
                           field)
        name = function.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise APIError(f"{where}'s name must be 1 to 64 letters, digits, '_' or '-'.",
                           field)
        if any(tool.name == name for tool in tools):
            raise APIError(f"Two tools are named {name!r}.", field)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise APIError(f"{where}'s description must be a string.", field)
        tools.append(FunctionTool(name, description, parameters_schema(
            function.get(schema_key), f"{where}'s {schema_key}", field)))
    return tools


def parameters_schema(schema: Any, where: str, field: str) -> dict[str, Any]:
    """A function's parameters (`where`: e.g. "tools[0]'s parameters"): a valid JSON schema
    of an object (none: no arguments)."""
    if schema is None:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    if not isinstance(schema, dict):
        raise APIError(f"{where} must be a JSON schema (an object).", field)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise APIError(f"{where} is not a valid JSON schema: {exc.message}.",
                       field) from exc
    if schema.get("type", "object") != "object":
        raise APIError(f"{where} must describe an object (type: object).", field)
    return {**copy.deepcopy(schema), "type": "object"}


def legacy_choice(value: Any) -> Any:
    """function_call ("none", "auto", {"name"}) in tool_choice's terms."""
    if isinstance(value, dict):
        return {"type": "function", "function": value}
    return value


def read_choice(choice: Any, tools: list[FunctionTool],
                field: str) -> tuple[Mode, FunctionTool | None]:
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise APIError(f"{field} 'required' needs at least one tool in tools.", field)
        return choice, None
    if (isinstance(choice, dict) and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)):
        name = choice["function"].get("name")
        for tool in tools:
            if tool.name == name:
                return "named", tool
        raise APIError(f"{field} names the function {name!r}, which is not among the tools "
                       f"({', '.join(t.name for t in tools) or 'none given'}).", field)
    raise APIError(f"{field} must be 'none', 'auto', 'required' or {{\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}.", field)
