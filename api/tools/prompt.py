"""Chat messages with tools, as the chat template takes them.

A template that renders tools itself (it refers to `tools`) gets them, and the history's
calls and results, in Hugging Face's conventions. Any other template gets a generic format:
the tools and how to call them in the system turn, each earlier call as the assistant wrote
it (in the call format: api/tools/formats.py), each tool result as a user turn in
`<tool_response>` tags. Under
tool_choice "none" no tools are shown.
"""

from __future__ import annotations

import json
from typing import Any

from api.errors import APIError
from api.tools.formats import GENERIC, CallFormat
from api.tools.plan import ToolPlan

INSTRUCTIONS = """You can call these tools (functions), each given as a JSON schema:
<tools>
{tools}
</tools>
To call a tool, answer with a JSON object per call, written like this:
{example}"""
MUST_CALL = "Answer with a tool call."
MUST_CALL_NAMED = "Answer with a call to the tool {name}."
ONE_CALL = "Call at most one tool."
MAY_ANSWER = "If no tool is needed, answer the user directly."


def template_renders_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def legacy_as_tools(messages: list[Any]) -> list[Any]:
    """The legacy function-calling turns in today's terms: an assistant's function_call as
    one tool call, a "function" message as the tool message answering the latest call of
    that name (APIError naming `messages` if none has been made)."""
    converted: list[Any] = []
    latest: dict[str, str] = {}  # function name -> the id given to its latest call
    for i, message in enumerate(messages):
        if message.function_call is not None:
            if message.role != "assistant" or message.tool_calls:
                raise APIError(f"messages[{i}]: function_call belongs to an assistant message "
                               "without tool_calls.", "messages")
            call_id = f"call_legacy_{i}"
            latest[str(message.function_call.get("name"))] = call_id
            message = message.model_copy(update={"function_call": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": message.function_call}]})
        elif message.role == "function":
            if message.name not in latest:
                raise APIError(f"messages[{i}] (role function) names {message.name!r}, which "
                               "no earlier assistant function_call called.", "messages")
            message = message.model_copy(update={"role": "tool",
                                                 "tool_call_id": latest[message.name],
                                                 "name": None})
        converted.append(message)
    return converted


def history_calls(messages: list[Any]) -> list[dict[str, Any]]:
    """The assistant messages' tool calls, checked: each {id, type "function", function:
    {name, arguments (a JSON text, or what came of one before a cut)}}, and every tool
    message answering an earlier one. Returned with their arguments decoded where they are
    JSON. APIError naming `messages` otherwise."""
    seen: dict[str, str] = {}
    decoded: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.role == "tool":
            if not message.tool_call_id:
                raise APIError(f"{where} (role tool) needs tool_call_id.", "messages")
            if message.tool_call_id not in seen:
                raise APIError(f"{where}'s tool_call_id {message.tool_call_id!r} matches no "
                               "tool call of an earlier assistant message.", "messages")
            continue
        if message.tool_calls and message.role != "assistant":
            raise APIError(f"{where}: only assistant messages have tool_calls.", "messages")
        if message.content is None and not message.tool_calls:
            raise APIError(f"{where} needs content (only an assistant message with "
                           "tool_calls may have none).", "messages")
        for call in message.tool_calls or []:
            function = call.get("function") if isinstance(call, dict) else None
            if (not isinstance(call.get("id") if function else None, str)
                    or call.get("type", "function") != "function"
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)):
                raise APIError(f"{where}'s tool_calls must each be {{id, type: function, "
                               "function: {name, arguments}}}.", "messages")
            try:
                arguments = json.loads(function["arguments"])
            except json.JSONDecodeError:
                # A call cut off by max_tokens (this server returns its arguments as far as
                # they came), sent back as it was: shown to the model as the text it is.
                arguments = function["arguments"]
            seen[call["id"]] = function["name"]
            decoded.append({"id": call["id"], "name": function["name"],
                            "arguments": arguments})
    return decoded


def render_messages(messages: list[Any], plan: ToolPlan | None, native: bool,
                    form: CallFormat = GENERIC) -> tuple[list[dict[str, Any]], list[dict] | None]:
    """The messages for the template, and the tools to pass it (`native`: the template
    renders tools itself; otherwise they go in the system turn, calls written in `form`)."""
    messages = legacy_as_tools(messages)
    calls = {c["id"]: c for c in history_calls(messages)}
    rendered: list[dict[str, Any]] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        text = message.text() if message.content is not None else ""
        if native:
            item: dict[str, Any] = {"role": role, "content": text}
            if message.tool_calls:
                item["tool_calls"] = [{"type": "function", "id": c["id"], "function": {
                    "name": calls[c["id"]]["name"],
                    "arguments": calls[c["id"]]["arguments"]}} for c in message.tool_calls]
            if role == "tool":
                item["tool_call_id"] = message.tool_call_id
                item["name"] = calls[message.tool_call_id]["name"]
        elif role == "tool":
            response = {"name": calls[message.tool_call_id]["name"], "content": text}
            item = {"role": "user",
                    "content": f"<tool_response>{json.dumps(response)}</tool_response>"}
        else:
            lines = [text] if text else []
            written = [form.render(calls[c["id"]]["name"], calls[c["id"]]["arguments"])
                       for c in message.tool_calls or []]
            if written:
                lines.append(form.prefix + form.separator.join(written))
            item = {"role": role, "content": "\n".join(lines)}
        if message.name is not None:
            item["name"] = message.name
        rendered.append(item)
    if plan is None or plan.mode == "none" or not plan.tools:
        return rendered, None
    if native:
        return rendered, [{"type": "function", "function": t.as_json()} for t in plan.tools]
    return with_tool_instructions(rendered, plan, form), None


def with_tool_instructions(messages: list[dict[str, Any]], plan: ToolPlan,
                           form: CallFormat = GENERIC) -> list[dict[str, Any]]:
    """The messages with the tools and the call format in the system turn (added first,
    or after the system message there is)."""
    example = form.render("<the tool's name>", "{<the arguments as JSON>}")
    parts = [INSTRUCTIONS.format(tools="\n".join(json.dumps(t.as_json()) for t in plan.tools),
                                 example=example)]
    if plan.chosen is not None:
        parts.append(MUST_CALL_NAMED.format(name=plan.chosen.name))
    elif plan.mode == "required":
        parts.append(MUST_CALL)
    else:
        parts.append(MAY_ANSWER)
    if not plan.parallel:
        parts.append(ONE_CALL)
    text = "\n".join(parts)
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": messages[0]["content"] + "\n\n" + text}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
