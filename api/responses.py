"""OpenAI API response bodies, as we send them (checked against OpenAI's published schema in
tests/api/test_openapi_schema.py).

Every choice has `logprobs` (always None for now): adding logprobs later means filling it,
not reshaping the responses. Fields that OpenAI leaves out rather than sending as null
(a stream chunk's usage, a delta's role) are dropped when None.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from engine.request import RequestOutput

FinishReason = Literal["stop", "length"]  # "abort" and "error" never reach a response


def omitted_if_none() -> Any:
    """A field default that is left out of the JSON when it is None."""
    return Field(default=None, exclude_if=lambda value: value is None)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, last: RequestOutput) -> Usage:
        return cls(prompt_tokens=last.num_prompt_tokens,
                   completion_tokens=last.num_output_tokens,
                   total_tokens=last.num_prompt_tokens + last.num_output_tokens)


# --- /v1/completions (a stream's chunks have the same shape) -------------------------------


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = omitted_if_none()  # only in the last chunk, if asked for


# --- /v1/chat/completions ------------------------------------------------------------------


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None  # OpenAI's schema requires the key


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = omitted_if_none()  # only in the first chunk
    content: str | None = omitted_if_none()


class ChatCompletionStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: FinishReason | None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: Usage | None = omitted_if_none()  # only in the last chunk, if asked for


# --- /v1/models and errors -----------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "nano-vllm"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
