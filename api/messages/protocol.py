"""Anthropic Messages API request bodies (/v1/messages and /v1/messages/count_tokens), as
far as we serve them: strict types for the fields we read. api/messages/to_chat.py turns a
body into the chat request that /v1/chat/completions would run.

Content blocks are typed (extra keys are a 400, not dropped); the kinds this server cannot
read (images, documents, thinking, server tools' blocks) parse as UnreadBlock, which the
translation refuses by name. Fields not declared here are kept (in model_extra) for
api/field_policy.py to judge.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from api.field_policy import COUNT_TOKENS, MESSAGES
from api.protocol import APIModel, NullFalse, RequestBody


class CacheControl(APIModel):
    """A prompt-cache breakpoint: no effect (the prefix cache needs none), but checked."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Metadata(APIModel):
    """No effect (user_id serves the provider's abuse monitoring), but checked."""

    model_config = ConfigDict(strict=True, extra="forbid")
    user_id: str | None = None


class Block(APIModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    cache_control: CacheControl | None = None


class TextBlock(Block):
    type: Literal["text"]
    text: str = Field(json_schema_extra={"minLength": 1})  # an empty one is a 400
    citations: list[dict] | None = None  # where an earlier answer's text came from: not shown


class Caller(APIModel):
    """Who made a tool call: the model itself ("direct"), or code it ran on Anthropic's
    servers (which this server does not run: refused by the translation)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["direct", "code_execution_20250825", "code_execution_20260120"]
    tool_id: str | None = None


class ToolUseBlock(Block):
    """An earlier call of the assistant's. The SDK's own response block, dumped, carries
    `caller` and `toolset_name` as null: the model's own call, of a client tool."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]
    caller: Caller | None = None
    toolset_name: str | None = None  # a server toolset's tool: refused by the translation


class UnreadBlock(APIModel):
    """A block this server cannot read; refused, naming its type."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["image", "document", "search_result", "thinking", "redacted_thinking",
                  "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
                  "code_execution_tool_result", "bash_code_execution_tool_result",
                  "text_editor_code_execution_tool_result", "tool_search_tool_result",
                  "container_upload", "tool_reference", "browser_state"]


ResultContentBlock = Annotated[TextBlock | UnreadBlock, Field(discriminator="type")]


class ToolResultBlock(Block):
    """The user's answer to an earlier tool_use."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ResultContentBlock] | None = None
    is_error: bool | None = None  # shown to the model as "Error: " before the content
    toolset_name: str | None = None  # a server toolset's result: refused by the translation


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | UnreadBlock,
                         Field(discriminator="type")]


class InputMessage(APIModel):
    """A turn; a "system" one (text only) is a system turn in its place in the chat."""

    model_config = ConfigDict(strict=True, extra="forbid")
    role: Literal["user", "assistant", "system"]
    # Neither empty (a 400, naming which): the document says so with minLength/minItems.
    content: Annotated[str, Field(json_schema_extra={"minLength": 1})] | Annotated[
        list[ContentBlock], Field(json_schema_extra={"minItems": 1})]


CallerType = Literal["direct", "code_execution_20250825", "code_execution_20260120",
                     "code_execution_20260521"]


class ToolDefinition(APIModel):
    """A client tool; server tools (web search and the like) are not offered."""

    model_config = ConfigDict(strict=True, extra="forbid")
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None  # calls always validate against input_schema (a grammar)
    # Who may call it: the model itself must be among them (code execution is not offered).
    allowed_callers: list[CallerType] | None = None
    defer_loading: bool | None = None  # True: found by a tool search, not offered: refused
    eager_input_streaming: bool | None = None  # how arguments stream: no effect here
    input_examples: list[dict[str, Any]] | None = None  # shown to the model in its description

    @model_validator(mode="before")
    @classmethod
    def client_tools_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(f"{kind!r} is a server tool; this server offers client tools "
                             "(a name and an input_schema) only")
        return value


class ToolChoiceAuto(APIModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(APIModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(APIModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(APIModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone,
                       Field(discriminator="type")]


class ThinkingConfig(APIModel):
    """A thinking model's switch: enabled (with a budget), adaptive (on, unbounded) or
    disabled."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=0)  # with "enabled"
    display: Literal["summarized", "omitted"] | None = None  # no effect: shown whole


class CountTokensRequest(RequestBody):
    """What shapes the prompt: the body of /v1/messages/count_tokens."""

    model_config = ConfigDict(strict=True, extra="allow")
    ENDPOINT: ClassVar[str] = COUNT_TOKENS

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    """The body of /v1/messages."""

    ENDPOINT: ClassVar[str] = MESSAGES

    max_tokens: int  # required, as Anthropic requires it
    stream: NullFalse = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # no effect: one tier
