"""An Anthropic Messages body as the chat request /v1/chat/completions runs: the one place
where Anthropic's terms become OpenAI's, so that the same chat rendering, tool grammar and
call parsing serve both.

- `system` becomes the system turn; a user message's text blocks a user turn, each of its
  tool_result blocks a tool message (is_error shown as "Error: " before the content); an
  assistant message's text its content and its tool_use blocks its tool_calls. Several text
  blocks in a row are joined by newlines.
- `tools` become function tools (input_schema as parameters); tool_choice `auto` stays auto,
  `any` is required, `tool` a named choice, `none` none; disable_parallel_tool_use is
  parallel_tool_calls false.
- `stop_sequences` is stop; max_tokens, temperature, top_p, top_k and stream keep their names.

Everything is checked here in Anthropic's terms (messages[1].content[0], tool_use_id,
input_schema), so the chat path's own checks never see a malformed history.
"""

from __future__ import annotations

import json
from typing import Any

from api.errors import APIError
from api.messages.protocol import (
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    ThinkingConfig,
    ToolChoice,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    UnreadBlock,
)
from api.openai.protocol import ChatCompletionRequest
from api.tools.plan import read_functions

READ_BLOCKS = ("this server reads text, tool_use and tool_result blocks only (and an "
               "assistant's thinking blocks)")
# An earlier answer's thinking, sent back as the SDK keeps it: left out of the prompt, as
# thinking models' chat templates leave out earlier turns' reasoning.
THINKING_BLOCKS = ("thinking", "redacted_thinking")


def to_chat(body: CountTokensRequest, accept_unknown: bool = False) -> ChatCompletionRequest:
    """The chat request for `body` (a count_tokens body has no sampling fields); APIError
    naming the field for anything refused or malformed (`accept_unknown`: a field no API
    defines is not, see api/field_policy.py)."""
    body.check_supported(accept_unknown)
    fields: dict[str, Any] = {"model": body.model, "messages": chat_messages(body)}
    if body.tools:
        fields["tools"] = chat_tools(body.tools)
    fields["tool_choice"], fields["parallel_tool_calls"] = chat_tool_choice(body.tool_choice,
                                                                            body.tools or [])
    if body.thinking is not None:
        fields.update(thinking_fields(body.thinking))
    if isinstance(body, MessagesRequest):
        if body.max_tokens < 1:
            raise APIError("max_tokens must be at least 1.", "max_tokens")
        if body.temperature is not None and not 0 <= body.temperature <= 1:
            raise APIError("temperature must be between 0 and 1.", "temperature")
        if body.top_k is not None and body.top_k < 0:
            raise APIError("top_k must be at least 0 (0: off).", "top_k")
        if any(not s for s in body.stop_sequences or []):
            raise APIError("stop_sequences must not contain empty strings.", "stop_sequences")
        fields.update(max_tokens=body.max_tokens, stream=body.stream, stop=body.stop_sequences,
                      temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    return ChatCompletionRequest.model_validate({k: v for k, v in fields.items()
                                                 if v is not None})


def thinking_fields(thinking: ThinkingConfig) -> dict[str, Any]:
    """The chat fields for Anthropic's thinking switch: disabled is reasoning_effort none
    (the template's enable_thinking: false), enabled's budget_tokens the thinking budget."""
    if thinking.type == "disabled":
        return {"reasoning_effort": "none"}
    if thinking.type == "enabled" and thinking.budget_tokens is None:
        raise APIError("thinking.budget_tokens is required with type 'enabled'.",
                       "thinking.budget_tokens")
    return {"thinking_token_budget": thinking.budget_tokens}


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """The system turn and every message, as chat messages."""
    rendered: list[dict[str, Any]] = []
    if isinstance(body.system, list) and any(not block.text for block in body.system):
        raise APIError("system: text content blocks must be non-empty.", "system")
    if body.system:
        system = body.system if isinstance(body.system, str) else joined(body.system)
        rendered.append({"role": "system", "content": system})
    calls: set[str] = set()  # the ids of the tool_use blocks so far
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        blocks = ([TextBlock(type="text", text=message.content)]
                  if isinstance(message.content, str) else message.content)
        if not blocks:
            raise APIError(f"{where}.content must not be empty.", "messages")
        for j, block in enumerate(blocks):
            check_block(block, message.role, f"{where}.content[{j}]", calls)
        check_answered(body, i, blocks)
        if message.role == "assistant":
            rendered.append(assistant_message(blocks))
        elif message.role == "system":
            if not all(isinstance(block, TextBlock) for block in blocks):
                raise APIError(f"{where}: a system message holds text blocks only.", "messages")
            rendered.append({"role": "system", "content": joined(blocks)})
        else:
            rendered += user_messages(blocks)
    if body.messages[-1].role == "assistant":
        raise APIError("The last message must be the user's: continuing a final assistant "
                       "message (prefill) is not supported.", "messages")
    return rendered


def check_block(block: Any, role: str, where: str, calls: set[str]) -> None:
    """A block this role may send, every tool_result answering an earlier tool_use (whose id
    `calls` collects)."""
    if isinstance(block, UnreadBlock) and not (
            role == "assistant" and block.type in THINKING_BLOCKS):
        raise APIError(f"{where} is a block of type {block.type!r}; {READ_BLOCKS}.",
                       "messages")
    if isinstance(block, TextBlock) and not block.text:
        raise APIError(f"{where}: text content blocks must be non-empty.", "messages")
    if isinstance(block, ToolUseBlock | ToolResultBlock) and block.toolset_name is not None:
        raise APIError(f"{where} belongs to the toolset {block.toolset_name!r}; this server "
                       "offers client tools only.", "messages")
    if isinstance(block, ToolUseBlock):
        check_call(block, role, where, calls)
    if isinstance(block, ToolResultBlock):
        check_result(block, role, where, calls)


def check_call(block: ToolUseBlock, role: str, where: str, calls: set[str]) -> None:
    """A tool_use block: the assistant's, with an id of its own, called by the model."""
    if role != "assistant":
        raise APIError(f"{where}: tool_use blocks belong in assistant messages.",
                       "messages")
    if block.id in calls:
        raise APIError(f"{where}: two tool_use blocks have the id {block.id!r}.",
                       "messages")
    if block.caller is not None and block.caller.type != "direct":
        raise APIError(f"{where} was called by {block.caller.type!r}; this server runs no "
                       "code execution, so only the model's own calls (caller "
                       "'direct') can be in the history.", "messages")
    calls.add(block.id)


def check_result(block: ToolResultBlock, role: str, where: str, calls: set[str]) -> None:
    """A tool_result block: the user's, answering an earlier call, read as text."""
    if role != "user":
        raise APIError(f"{where}: tool_result blocks belong in user messages.", "messages")
    if block.tool_use_id not in calls:
        raise APIError(f"{where}'s tool_use_id {block.tool_use_id!r} matches no tool_use "
                       "block of an earlier assistant message.", "messages")
    for k, part in enumerate(block.content if isinstance(block.content, list) else []):
        if isinstance(part, UnreadBlock):
            raise APIError(f"{where}.content[{k}] is a block of type {part.type!r}; "
                           "tool results are read as text only.", "messages")


def check_answered(body: CountTokensRequest, i: int, blocks: list[Any]) -> None:
    """Tool blocks need tools defined, and the tool_use blocks of an assistant message need
    a tool_result each in the next message (as Anthropic's API requires)."""
    uses = [block.id for block in blocks if isinstance(block, ToolUseBlock)]
    if not body.tools and any(isinstance(b, ToolUseBlock | ToolResultBlock) for b in blocks):
        raise APIError(f"messages[{i}] has tool_use or tool_result blocks, which need tools "
                       "to be defined.", "tools")
    if not uses or i + 1 >= len(body.messages):
        return  # a last assistant message is refused as prefill
    after = body.messages[i + 1].content
    answered = {block.tool_use_id for block in (after if isinstance(after, list) else [])
                if isinstance(block, ToolResultBlock)}
    missing = [use for use in uses if use not in answered]
    if missing:
        raise APIError(f"messages[{i}]'s tool_use ids {missing} have no tool_result block in "
                       f"messages[{i + 1}], right after them.", "messages")


def joined(blocks: list[Any]) -> str:
    return "\n".join(block.text for block in blocks)


def user_messages(blocks: list[Any]) -> list[dict[str, Any]]:
    """Each run of text blocks as a user turn, each tool_result as a tool message."""
    messages: list[dict[str, Any]] = []
    texts: list[TextBlock] = []
    for block in [*blocks, None]:  # None: the end, which closes the last run of text
        if isinstance(block, TextBlock):
            texts.append(block)
            continue
        if texts:
            messages.append({"role": "user", "content": joined(texts)})
            texts = []
        if isinstance(block, ToolResultBlock):
            content = (block.content if isinstance(block.content, str)
                       else joined(block.content or []))
            if block.is_error:
                content = f"Error: {content}"
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id,
                             "content": content})
    return messages


def assistant_message(blocks: list[Any]) -> dict[str, Any]:
    texts = [block for block in blocks if isinstance(block, TextBlock)]
    calls = [{"id": block.id, "type": "function",
              "function": {"name": block.name, "arguments": json.dumps(block.input)}}
             for block in blocks if isinstance(block, ToolUseBlock)]
    message: dict[str, Any] = {"role": "assistant", "content": joined(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_tools(tools: list[ToolDefinition]) -> list[dict[str, Any]]:
    """Function tools, checked in Anthropic's terms (input_schema) first."""
    for i, tool in enumerate(tools):
        if tool.defer_loading:
            raise APIError(f"tools[{i}] has defer_loading: true, which leaves it for a tool "
                           "search to find; this server offers no tool search.", "tools")
        if tool.allowed_callers is not None and "direct" not in tool.allowed_callers:
            raise APIError(f"tools[{i}]'s allowed_callers leave out 'direct': only code "
                           "execution could call it, and this server runs none.", "tools")
    described = [{"name": t.name, "description": describe(t), "input_schema": t.input_schema}
                 for t in tools]
    read_functions(described, "tools", schema_key="input_schema")
    functions = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if (description := describe(tool)) is not None:
            function["description"] = description
        functions.append({"type": "function", "function": function})
    return functions


def describe(tool: ToolDefinition) -> str | None:
    """The tool's description, with its input_examples after it (the model sees them as the
    description's end: the chat template has no place of their own for them)."""
    if not tool.input_examples:
        return tool.description
    examples = "\n".join(json.dumps(example) for example in tool.input_examples)
    return f"{tool.description or ''}\n\nExample inputs:\n{examples}".lstrip()


def chat_tool_choice(choice: ToolChoice | None,
                     tools: list[ToolDefinition]) -> tuple[Any, bool | None]:
    """tool_choice and parallel_tool_calls in chat's terms."""
    if choice is None:
        return None, None
    if isinstance(choice, ToolChoiceNone):
        return "none", None
    parallel = False if choice.disable_parallel_tool_use else None
    if isinstance(choice, ToolChoiceAny | ToolChoiceTool) and not tools:
        raise APIError(f"tool_choice {choice.type!r} needs at least one tool in tools.",
                       "tool_choice")
    if isinstance(choice, ToolChoiceTool):
        if all(tool.name != choice.name for tool in tools):
            names = ", ".join(tool.name for tool in tools)
            raise APIError(f"tool_choice names the tool {choice.name!r}, which is not among "
                           f"the tools ({names}).", "tool_choice")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return ("required" if isinstance(choice, ToolChoiceAny) else "auto"), parallel
