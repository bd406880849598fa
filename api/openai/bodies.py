"""OpenAI API response bodies, as we send them (checked against OpenAI's published schema in
tests/api/test_openapi_schema.py).

Every choice has `logprobs` (None unless asked for). Fields that OpenAI leaves out rather
than sending as null (a stream chunk's usage, a delta's role) are dropped when None, and so
is our one extension, `timing`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

# "abort" and "error" never reach a response; "tool_calls": the answer is tool calls.
FinishReason = Literal["stop", "length", "tool_calls"]


def omitted_if_none() -> Any:
    """A field default that is left out of the JSON when it is None."""
    return Field(default=None, exclude_if=lambda value: value is None)


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens taken from the prefix cache


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int  # thinking tokens between the tags (the tags not counted)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
           reasoning_tokens: int = 0) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
                   completion_tokens_details=CompletionTokensDetails(
                       reasoning_tokens=reasoning_tokens))


class Timing(BaseModel):
    """Our extension: where one prompt's time went (non-streamed responses only)."""

    prompt_index: int
    queue_time_ms: float | None  # arrival to first seated in the batch
    time_to_first_token_ms: float | None  # arrival to the first output token
    decode_time_ms: float | None  # first output token to the last (longest sample)
    prompt_tokens_computed: int  # all samples, recomputation after preemption included
    prompt_tokens_cached: int  # found in the prefix cache
    num_preemptions: int  # all samples


# --- /v1/completions (a stream's chunks have the same shape) -------------------------------


class CompletionLogprobs(BaseModel):
    """One entry per token of the choice's text (the prompt's first, with echo)."""

    tokens: list[str]
    token_logprobs: list[float | None]  # None: the prompt's first token (echo)
    top_logprobs: list[dict[str, float] | None]  # the top `logprobs`, plus the chosen token
    text_offset: list[int]  # where each token's text starts in the choice's text


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    timing: list[Timing] | None = omitted_if_none()


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = omitted_if_none()  # the last chunk, if asked for (or every one)


# --- /v1/chat/completions ------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: float  # -9999.0 for a token the sampler could not pick (processed mode)
    bytes: list[int] | None  # the token's UTF-8 bytes (a character may span tokens)


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # the `top_logprobs` most likely, most likely first


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the answer is tool calls only
    refusal: None = None  # OpenAI's schema requires the key
    tool_calls: list[ToolCall] | None = omitted_if_none()
    # A thinking model's reasoning (api/thinking.py), under both names clients read: vLLM's
    # older reasoning_content and its newer reasoning.
    reasoning_content: str | None = omitted_if_none()
    reasoning: str | None = omitted_if_none()


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage
    timing: list[Timing] | None = omitted_if_none()


class DeltaFunctionCall(BaseModel):
    name: str | None = omitted_if_none()  # in a call's first delta only
    arguments: str | None = omitted_if_none()  # a piece of the arguments' JSON text


class DeltaToolCall(BaseModel):
    index: int  # which call of the choice
    id: str | None = omitted_if_none()  # id and type in a call's first delta only
    type: Literal["function"] | None = omitted_if_none()
    function: DeltaFunctionCall


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = omitted_if_none()  # only in the first chunk
    content: str | None = omitted_if_none()
    tool_calls: list[DeltaToolCall] | None = omitted_if_none()
    reasoning_content: str | None = omitted_if_none()  # the same piece under both names
    reasoning: str | None = omitted_if_none()


class ChatCompletionStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: FinishReason | None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: Usage | None = omitted_if_none()  # the last chunk, if asked for (or every one)


# --- /tokenize, /detokenize (vLLM's) ------------------------------------------------------


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


# --- /v1/models and errors -----------------------------------------------------------------


class ModelCard(BaseModel):
    """OpenAI's model object, with the fields of Anthropic's (type, display_name, created_at),
    so that both clients read /v1/models."""
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "nano-vllm"
    max_model_len: int  # prompt + completion tokens one request may hold here
    model_type: str  # the architecture, as config.json names it
    max_position_embeddings: int  # the model's own context length
    type: Literal["model"] = "model"  # Anthropic's
    display_name: str  # Anthropic's: the id
    created_at: str  # Anthropic's: `created` in RFC 3339


class ModelList(BaseModel):
    """OpenAI's list; has_more, first_id and last_id are Anthropic's page fields."""
    object: Literal["list"] = "list"
    data: list[ModelCard]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class HealthStatus(BaseModel):
    status: Literal["ok"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
