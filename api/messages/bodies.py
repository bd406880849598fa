"""Anthropic Messages API response bodies, stream events and errors, as we send them
(the `anthropic` client parses each into its own types: tests/api/test_messages_api.py).

A message's content is a thinking block (a thinking model's reasoning), a text block and
tool_use blocks, each where the answer has that part, in that order. A stream is
message_start, then for each block content_block_start, its deltas and content_block_stop,
then message_delta (why it stopped, the output tokens) and message_stop.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from api.openai.bodies import Timing, omitted_if_none

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
# Anthropic's error type for each HTTP status we answer with.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 504: "timeout_error"}


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # nothing is signed here: the block is taken back as it is sent


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str  # "toolu_..."
    name: str
    input: dict[str, Any]  # the call's arguments, validated against its input_schema


ContentBlock = ThinkingContent | TextContent | ToolUseContent


class MessageUsage(BaseModel):
    """Anthropic's split of the prompt: the three input counts add up to the whole rendered
    prompt. The prefix cache is automatic here, so nothing is written to it on request
    (cache_creation_input_tokens 0) and cache_read_input_tokens is what it held."""
    input_tokens: int  # prompt tokens computed for this request
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0  # prompt tokens taken from the prefix cache


class MessageResponse(BaseModel):
    id: str  # "msg_..."
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]  # empty when the model ended at once
    model: str
    stop_reason: StopReason | None  # None only in message_start
    stop_sequence: str | None  # the stop sequence that matched, with "stop_sequence"
    usage: MessageUsage
    timing: list[Timing] | None = omitted_if_none()  # ours, as on the OpenAI routes


class TokenCount(BaseModel):
    input_tokens: int


# --- stream events (each sent as `event: <type>` with the JSON as data) -------------------


class MessageStartEvent(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: MessageResponse  # no content yet, usage.output_tokens 0


class ContentBlockStartEvent(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock  # empty thinking or text, or a call with input {}


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class InputJSONDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str  # the pieces of a block join into its input's JSON text


class ContentBlockDeltaEvent(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta | InputJSONDelta


class ContentBlockStopEvent(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDelta(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDeltaUsage(BaseModel):
    """The final counts (Anthropic's message_delta repeats the input ones)."""
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageDeltaEvent(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDelta
    usage: MessageDeltaUsage


class MessageStopEvent(BaseModel):
    type: Literal["message_stop"] = "message_stop"


STREAM_EVENTS: tuple[type[BaseModel], ...] = (
    MessageStartEvent, ContentBlockStartEvent, ContentBlockDeltaEvent, ContentBlockStopEvent,
    MessageDeltaEvent, MessageStopEvent)


# --- errors --------------------------------------------------------------------------------


class AnthropicErrorDetail(BaseModel):
    type: str  # ERROR_TYPES' values
    message: str  # begins with the field at fault, when there is one
    details: dict[str, str] | None = omitted_if_none()  # {"error_code"}, where there is one


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


# The error codes Anthropic's clients act on, sent in details.error_code (no other is).
ANTHROPIC_ERROR_CODES = frozenset({"thread_unsupported_request"})


def anthropic_error_body(status: int, message: str, param: str | None = None,
                         code: str | None = None) -> AnthropicErrorResponse:
    """An error in Anthropic's shape, which has no `param`: the field leads the message
    ("max_tokens: Field required"), unless the message already names it; a code of
    ANTHROPIC_ERROR_CODES goes in `details.error_code`, where Anthropic's clients look."""
    if param and param not in message:
        message = f"{param}: {message}"
    err_type = ERROR_TYPES.get(status, "api_error" if status >= 500 else
                               "invalid_request_error")
    return AnthropicErrorResponse(error=AnthropicErrorDetail(
        type=err_type, message=message,
        details={"error_code": code} if code in ANTHROPIC_ERROR_CODES else None))
