"""OpenAI's /v1/responses request body, and its translation into a chat request.

A Responses body says what a chat body says in other words: `input` items are messages
(`function_call` items an assistant's tool calls, `function_call_output` items tool
messages), `instructions` a system message, tools are flat (`{"type": "function", "name",
"parameters"}`), and `text.format` is `response_format`. `to_chat` writes it as the
ChatCompletionRequest the chat path takes, so one renderer, one tool grammar and one call
parser serve both. What the chat path cannot check in Responses' terms (an output whose
call_id matches no call, an item type it does not know) is checked here, naming `input`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, PrivateAttr

from api.errors import APIError
from api.field_policy import RESPONSES
from api.openai.protocol import ChatCompletionRequest, ChatMessage
from api.protocol import MIN_REQUEST_TIMEOUT, APIModel, NullFalse, RequestBody

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")


class ResponsesStreamOptions(APIModel):
    include_obfuscation: bool | None = None  # no padding is sent either way


class Reasoning(APIModel):
    """A reasoning model's settings: effort none or minimal turns thinking off; summary is
    accepted and has no effect (the reasoning is given whole)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # its older name


class ResponsesRequest(RequestBody):
    """The fields this server reads; the others are kept (in model_extra) for the field
    policy to judge."""

    model_config = ConfigDict(strict=True, extra="allow")
    ENDPOINT: ClassVar[str] = RESPONSES

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: NullFalse = False
    stream_options: ResponsesStreamOptions | None = None
    metadata: dict[str, str] | None = None
    reasoning: Reasoning | None = None
    store: bool | None = None
    user: str | None = None
    request_timeout: float | None = Field(default=None, ge=MIN_REQUEST_TIMEOUT,
                                          allow_inf_nan=False)

    def to_chat(self) -> ResponsesChat:
        """The chat request that asks the same; APIError naming the Responses field when
        something here cannot be said in chat's terms."""
        fields = {
            "messages": input_messages(self.input, self.instructions),
            "model": self.model, "stream": self.stream,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p,
            "tools": chat_tools(self.tools) if self.tools is not None else None,
            "tool_choice": chat_tool_choice(self.tool_choice),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": response_format(self.text),
            "reasoning_effort": self.reasoning.effort if self.reasoning else None,
            "user": self.user, "request_timeout": self.request_timeout,
        }
        chat = ResponsesChat(**{k: v for k, v in fields.items() if v is not None})
        chat._source = self
        return chat


class ResponsesChat(ChatCompletionRequest):
    """A Responses request in chat's terms, with the request it came from (`source`), which
    says what the response object echoes back."""

    PROMPT_FIELD: ClassVar[str] = "input"
    _source: ResponsesRequest | None = PrivateAttr(default=None)

    @property
    def source(self) -> ResponsesRequest:
        assert self._source is not None, "made by ResponsesRequest.to_chat"
        return self._source


def bad_input(message: str) -> APIError:
    return APIError(message, "input")


def input_messages(value: str | list[dict[str, Any]],
                   instructions: str | None) -> list[ChatMessage]:
    """The chat messages `input` (after `instructions`) stands for."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    items = [{"role": "user", "content": value}] if isinstance(value, str) else value
    if not items:
        raise bad_input("input must be a string or a non-empty list of items.")
    call_ids: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": message_role(item, where),
                             "content": text_of(item.get("content"), where)})
        elif kind == "function_call":
            add_call(messages, item, where, call_ids)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in call_ids:
                raise bad_input(f"{where}'s call_id {call_id!r} matches no function_call "
                                "earlier in input.")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": text_of(item.get("output"), where)})
        elif kind != "reasoning":  # an earlier answer's reasoning, sent back: left out, as
            # thinking models' chat templates leave out earlier turns' reasoning
            raise bad_input(f"{where} is of type {kind!r}; only message, function_call, "
                            "function_call_output and reasoning items are offered.")
    return [ChatMessage(**message) for message in messages]


def message_role(item: dict[str, Any], where: str) -> str:
    role = item.get("role")
    if role not in ROLES:
        raise bad_input(f"{where}'s role must be one of {', '.join(ROLES)}; got {role!r}.")
    return role


def text_of(content: Any, where: str) -> str:
    """A message's content (or a call's output): a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_input(f"{where}'s content must be a string or a list of text parts.")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_input(f"{where} has a content part of type {kind!r}; only text "
                            "(input_text, output_text, each with its text) is offered.")
        texts.append(part["text"])
    return "".join(texts)


def add_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str,
             call_ids: set[str]) -> None:
    """A function_call item as a tool call of the assistant message before it (a new one
    unless the last message is the assistant's)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str)
            and isinstance(arguments, str)):
        raise bad_input(f"{where} (function_call) needs call_id, name and arguments, each a "
                        "string.")
    if call_id in call_ids:
        raise bad_input(f"{where}'s call_id {call_id!r} is used by an earlier function_call.")
    call_ids.add(call_id)  # arguments that are not JSON (a call cut off) are shown as they are
    call = {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat function tools as chat's nested ones; api/tools/plan.py checks what is inside."""
    nested = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(f"tools[{i}] is of type {tool.get('type')!r}; only function tools "
                           "({\"type\": \"function\", \"name\", \"parameters\"}) are offered.",
                           "tools")
        nested.append({"type": "function", "function": {
            key: tool[key] for key in ("name", "description", "parameters") if key in tool}})
    return nested


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """{"type": "function", "name"} as chat's {"type": "function", "function": {"name"}};
    the modes as they are (api/tools/plan.py checks them)."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise APIError("tool_choice must be 'none', 'auto', 'required' or {\"type\": "
                       "\"function\", \"name\": ...}; built-in, custom and allowed_tools "
                       "choices are not offered.", "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format as chat's response_format (None: free text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
            raise APIError("text.format of type json_schema needs name (a string) and schema "
                           "(a JSON schema).", "text.format")
        unknown = sorted(set(fmt) - {"type", "name", "schema", "strict", "description"})
        if unknown:
            raise APIError(f"text.format has no field {unknown[0]!r} (it takes type, name, "
                           "schema, strict, description).", "text.format")
        # name, strict and description are checked in chat's terms, as response_format's
        return {"type": "json_schema", "json_schema": {
            key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}}
    raise APIError(f"text.format.type must be 'text', 'json_object' or 'json_schema'; got "
                   f"{kind!r}.", "text.format")
