"""Completions and chat: from a validated request body to the engine and back.

OpenAIServing does what both endpoints share: check the body, submit the request, then
either collect the engine's outputs into one JSON body or turn each into one SSE event, and
abort the request when its client leaves. CompletionServing and ChatServing say how the
prompt is built and what a response and a stream chunk look like.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from api.engine_client import EngineClient
from api.errors import RETRY_AFTER_SECONDS, APIError, error_body
from api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from api.responses import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    CompletionChoice,
    CompletionResponse,
    CompletionStreamResponse,
    DeltaMessage,
    FinishReason,
    Usage,
)
from engine.batch_engine import QueueFullError
from engine.request import Request as EngineRequest
from engine.request import RequestOutput, SamplingParams

# A client that left is noticed within this long, also while outputs keep coming.
DISCONNECT_CHECK_SECONDS = 1.0
SSE_PING_SECONDS = 15

Body = TypeVar("Body", bound=SamplingFields)


@dataclass
class Submitted:
    """A request handed to the engine: its outputs arrive in `queue`."""

    request_id: str
    model: str
    queue: asyncio.Queue[RequestOutput]
    created: int = field(default_factory=lambda: int(time.time()))


def sse(message: BaseModel) -> dict[str, str]:
    return {"data": message.model_dump_json()}


class OpenAIServing(ABC, Generic[Body]):
    """One generating endpoint; subclasses fill in the prompt and the response shapes."""

    request_id_prefix: ClassVar[str]

    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.accepted_model_names = {model_name, "default"}

    async def create(self, body: Body, http_request: Request) -> Response:
        """Validate, submit, and answer with one JSON body or an SSE stream."""
        self.check_model(body)
        body.check_supported()
        prompt_ids = self.prompt_ids(body)
        params = body.to_sampling_params(len(prompt_ids), self.engine.max_tokens_per_request,
                                         len(self.tokenizer))
        job = self.submit(prompt_ids, params)
        if body.stream:
            return EventSourceResponse(self.events(job, body.include_usage, http_request),
                                       ping=SSE_PING_SECONDS)
        return await self.collect(job, http_request)

    def check_model(self, body: Body) -> None:
        if body.model is not None and body.model not in self.accepted_model_names:
            raise APIError(f"The model '{body.model}' does not exist; this server serves "
                           f"'{self.model_name}'.", "model", code="model_not_found")

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Submitted:
        loop = asyncio.get_running_loop()
        job = Submitted(f"{self.request_id_prefix}-{uuid.uuid4().hex}", self.model_name,
                        asyncio.Queue())

        def deliver(output: RequestOutput) -> None:  # called on the engine thread
            loop.call_soon_threadsafe(job.queue.put_nowait, output)

        try:
            self.engine.add_request(EngineRequest(job.request_id, prompt_ids, params, deliver))
        except QueueFullError as exc:
            raise APIError(f"{exc}; retry after {RETRY_AFTER_SECONDS} s.", status=429,
                           code="rate_limit_exceeded", err_type="rate_limit_error") from exc
        return job

    async def outputs(self, job: Submitted,
                      http_request: Request) -> AsyncIterator[RequestOutput]:
        """The engine's outputs until the last; aborts the request if the client leaves.

        The client is checked at least every DISCONNECT_CHECK_SECONDS, also while outputs
        keep coming (a non-streaming handler would otherwise notice only at the end)."""
        finished = False
        checked = time.monotonic()
        try:
            while not finished:
                try:
                    output = await asyncio.wait_for(job.queue.get(), DISCONNECT_CHECK_SECONDS)
                except TimeoutError:
                    output = None
                if output is None or time.monotonic() - checked >= DISCONNECT_CHECK_SECONDS:
                    checked = time.monotonic()
                    if await http_request.is_disconnected():
                        return
                if output is not None:
                    finished = output.finished
                    yield output
        finally:
            if not finished:
                self.engine.abort(job.request_id)

    async def collect(self, job: Submitted, http_request: Request) -> Response:
        """The whole answer as one JSON body, once the last output is in."""
        texts, last = [], None
        async for output in self.outputs(job, http_request):
            texts.append(output.text)
            last = output
        if last is None or not last.finished:
            return Response(status_code=499)  # the client is gone; nobody reads this
        if last.error:
            raise APIError(last.error, status=500, err_type="server_error")
        return JSONResponse(self.response(job, "".join(texts), last).model_dump())

    async def events(self, job: Submitted, include_usage: bool,
                     http_request: Request) -> AsyncIterator[dict[str, str]]:
        """One SSE event per output (so per token), usage if asked, then [DONE]."""
        for chunk in self.opening_chunks(job):
            yield sse(chunk)
        async for output in self.outputs(job, http_request):
            if output.error:
                yield sse(error_body(output.error, "server_error"))
                break
            yield sse(self.chunk(job, output.text, output.finish_reason))
            if output.finished and include_usage:
                yield sse(self.usage_chunk(job, Usage.of(output)))
        yield {"data": "[DONE]"}

    # --- what each endpoint fills in ---------------------------------------------------------

    @abstractmethod
    def prompt_ids(self, body: Body) -> list[int]:
        """The prompt's token ids; APIError if there are none or some are out of range."""

    @abstractmethod
    def response(self, job: Submitted, text: str, last: RequestOutput) -> BaseModel:
        """The non-streamed body: the whole text, and `last` for finish reason and usage."""

    def opening_chunks(self, job: Submitted) -> list[BaseModel]:
        """Chunks sent before the first output."""
        return []

    @abstractmethod
    def chunk(self, job: Submitted, text: str, finish_reason: FinishReason | None) -> BaseModel:
        """The stream chunk of one output."""

    @abstractmethod
    def usage_chunk(self, job: Submitted, usage: Usage) -> BaseModel:
        """The stream's last chunk when usage is asked for: no choices, only usage."""


class CompletionServing(OpenAIServing[CompletionRequest]):
    """POST /v1/completions: a prompt as text or token ids."""

    request_id_prefix = "cmpl"

    def prompt_ids(self, body: CompletionRequest) -> list[int]:
        prompt = body.single_prompt()
        vocab_size = len(self.tokenizer)
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt).input_ids if prompt else []
        else:
            ids = list(prompt)
            if any(not 0 <= t < vocab_size for t in ids):
                raise APIError(f"Token ids in 'prompt' must be in [0, {vocab_size}).",
                               "prompt")
        if not ids:
            raise APIError("The prompt is empty.", "prompt")
        return ids

    def response(self, job: Submitted, text: str, last: RequestOutput) -> CompletionResponse:
        return CompletionResponse(
            id=job.request_id, created=job.created, model=job.model,
            choices=[CompletionChoice(text=text, finish_reason=last.finish_reason)],
            usage=Usage.of(last))

    def chunk(self, job: Submitted, text: str,
              finish_reason: FinishReason | None) -> CompletionStreamResponse:
        return CompletionStreamResponse(
            id=job.request_id, created=job.created, model=job.model,
            choices=[CompletionChoice(text=text, finish_reason=finish_reason)])

    def usage_chunk(self, job: Submitted, usage: Usage) -> CompletionStreamResponse:
        return CompletionStreamResponse(id=job.request_id, created=job.created,
                                        model=job.model, choices=[], usage=usage)


class ChatServing(OpenAIServing[ChatCompletionRequest]):
    """POST /v1/chat/completions: messages rendered with the model's chat template."""

    request_id_prefix = "chatcmpl"

    def prompt_ids(self, body: ChatCompletionRequest) -> list[int]:
        text = self.tokenizer.apply_chat_template(body.template_messages(), tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def response(self, job: Submitted, text: str, last: RequestOutput) -> ChatCompletionResponse:
        message = ChatCompletionMessage(content=text)
        return ChatCompletionResponse(
            id=job.request_id, created=job.created, model=job.model,
            choices=[ChatCompletionChoice(message=message, finish_reason=last.finish_reason)],
            usage=Usage.of(last))

    def opening_chunks(self, job: Submitted) -> list[BaseModel]:
        """The role comes first, in a chunk of its own (as OpenAI sends it)."""
        return [self._chunk(job, DeltaMessage(role="assistant", content=""), None)]

    def chunk(self, job: Submitted, text: str,
              finish_reason: FinishReason | None) -> ChatCompletionStreamResponse:
        # The last chunk carries only finish_reason when no text came with it.
        content = text if text or finish_reason is None else None
        return self._chunk(job, DeltaMessage(content=content), finish_reason)

    def usage_chunk(self, job: Submitted, usage: Usage) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=job.request_id, created=job.created,
                                            model=job.model, choices=[], usage=usage)

    def _chunk(self, job: Submitted, delta: DeltaMessage,
               finish_reason: FinishReason | None) -> ChatCompletionStreamResponse:
        choice = ChatCompletionStreamChoice(delta=delta, finish_reason=finish_reason)
        return ChatCompletionStreamResponse(id=job.request_id, created=job.created,
                                            model=job.model, choices=[choice])
