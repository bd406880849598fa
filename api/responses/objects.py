"""The Responses API's bodies as we send them: the response object, its output items, and
the events of a stream (checked against OpenAI's published schema in
tests/api/test_responses_api.py).

Logprobs and annotations are always empty lists: neither is offered here, and the schema
requires the keys.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from api.openai.bodies import Timing, Usage, omitted_if_none

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str  # what the client's function_call_output answers
    name: str
    arguments: str  # a JSON text
    status: ItemStatus


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """A thinking model's reasoning, whole (as `content`; no summary is made)."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: ItemStatus


OutputItem = Annotated[ReasoningItem | OutputMessage | FunctionCallItem,
                       Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int  # taken from the prefix cache
    cache_write_tokens: int  # computed, their K and V written to the cache


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # thinking tokens between the tags (the tags not counted)


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        cached = usage.prompt_tokens_details.cached_tokens
        return cls(input_tokens=usage.prompt_tokens,
                   input_tokens_details=InputTokensDetails(
                       cached_tokens=cached, cache_write_tokens=usage.prompt_tokens - cached),
                   output_tokens=usage.completion_tokens,
                   output_tokens_details=OutputTokensDetails(
                       reasoning_tokens=usage.completion_tokens_details.reasoning_tokens),
                   total_tokens=usage.total_tokens)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """A response: in progress (a stream's first events), completed, or incomplete (it ran
    out of max_output_tokens, or of room in the context). The request's settings are echoed
    back, with their defaults where they were not sent."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    completed_at: int | None = None
    error: None = None  # a failure is an error envelope (or an error event), not a response
    incomplete_details: IncompleteDetails | None = None
    model: str
    instructions: str | None
    output: list[OutputItem]
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    max_output_tokens: int | None
    text: dict[str, Any]
    metadata: dict[str, str]
    previous_response_id: None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = omitted_if_none()  # once finished
    timing: list[Timing] | None = omitted_if_none()  # ours, as on chat: non-streamed only


# --- the events of a stream: each has its type and its place in the stream ---------------


class StreamEvent(BaseModel):
    sequence_number: int


class ResponseLifecycleEvent(StreamEvent):
    type: Literal["response.created", "response.in_progress", "response.completed",
                  "response.incomplete"]
    response: ResponseObject


class OutputItemEvent(StreamEvent):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(StreamEvent):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class TextDeltaEvent(StreamEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(StreamEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningDeltaEvent(StreamEvent):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDoneEvent(StreamEvent):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDeltaEvent(StreamEvent):
    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta")
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(StreamEvent):
    type: Literal["response.function_call_arguments.done"] = (
        "response.function_call_arguments.done")
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(StreamEvent):
    """A failure once the stream has begun (the deadline passed, the engine stopped)."""

    type: Literal["error"] = "error"
    code: str | None
    message: str
    param: str | None


STREAM_EVENTS: list[type[StreamEvent]] = [
    ResponseLifecycleEvent, OutputItemEvent, ContentPartEvent, TextDeltaEvent, TextDoneEvent,
    ReasoningDeltaEvent, ReasoningDoneEvent,
    ArgumentsDeltaEvent, ArgumentsDoneEvent, ErrorEvent]
