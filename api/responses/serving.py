"""POST /v1/responses: a Responses body translated into a chat request
(api/responses/protocol.py) and run through the chat path (prompt, tool grammar, engine,
call parsing); only the answer's shape is its own (api/responses/objects.py,
api/responses/output.py).

The server is stateless: nothing is stored, so `store` has no effect and
`previous_response_id` is refused (api/field_policy.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import Response

from api.errors import APIError
from api.event_stream import named_sse
from api.job import Job
from api.openai.chat import ChatServing
from api.openai.protocol import ChatCompletionRequest
from api.responses.objects import (
    ErrorEvent,
    IncompleteDetails,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponseUsage,
)
from api.responses.output import Item, ResponseOutput
from api.responses.protocol import ResponsesChat, ResponsesRequest
from api.serving import failure
from engine.request import FinishReason

Status = Literal["in_progress", "completed", "incomplete"]

# The chat fields an error from the chat path may name, in Responses' terms.
RESPONSES_TERMS = {"messages": "input", "prompt": "input",
                   "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                   "response_format": "text.format"}
CHAT_WORDS = re.compile(r"\b(max_completion_tokens|max_tokens|response_format)\b")


def in_responses_terms(exc: APIError) -> None:
    """An error of the chat path made to name the Responses field (in param and message)."""
    exc.param = RESPONSES_TERMS.get(exc.param or "", exc.param)
    exc.message = CHAT_WORDS.sub(lambda m: RESPONSES_TERMS[m.group(1)], exc.message)
    exc.args = (exc.message,)


def source_of(body: ChatCompletionRequest) -> ResponsesRequest:
    assert isinstance(body, ResponsesChat), "the chat request is a translated one"
    return body.source


def final_status(job: Job) -> Status:
    last = job.samples[0, 0].last
    assert last is not None, "the job is done"
    return "incomplete" if last.finish_reason is FinishReason.LENGTH else "completed"


class ResponsesServing(ChatServing):
    request_id_prefix = "resp"
    request_id_separator = "_"  # resp_..., as OpenAI's ids are

    async def create_response(self, request: ResponsesRequest,
                              http_request: Request) -> Response:
        """Check the Responses fields, then answer as the chat path would, in this shape."""
        request.check_supported(self.accept_unknown_fields)
        chat = request.to_chat()
        try:
            return await self.create(chat, http_request)
        except APIError as exc:
            in_responses_terms(exc)
            raise

    def response(self, job: Job, body: ChatCompletionRequest) -> ResponseObject:
        status = final_status(job)
        output = ResponseOutput(self.chat_format.calls)
        output.advance(self.reader(body, job, 0).read(job.samples[0, 0].text, finished=True),
                       finished=True, incomplete=status == "incomplete")
        return self.response_object(job, body, output.items, status)

    def response_object(self, job: Job, body: ChatCompletionRequest,
                        items: list[Item],
                        status: Status) -> ResponseObject:
        """The response with `items` so far, and the request's settings echoed back."""
        request = source_of(body)
        text = dict(request.text or {})
        if text.get("format") is None:
            text["format"] = {"type": "text"}
        return ResponseObject(
            id=job.response_id, created_at=job.created, status=status,
            completed_at=int(time.time()) if status == "completed" else None,
            incomplete_details=(IncompleteDetails(reason="max_output_tokens")
                                if status == "incomplete" else None),
            model=job.model, instructions=request.instructions, output=list(items),
            tools=echo_tools(request.tools or []), tool_choice=request.tool_choice or "auto",
            parallel_tool_calls=request.parallel_tool_calls is not False,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            max_output_tokens=request.max_output_tokens, text=text,
            metadata=request.metadata or {},
            usage=ResponseUsage.of(job.usage()) if status != "in_progress" else None)

    async def events(self, job: Job, body: ChatCompletionRequest,
                     http_request: Request) -> AsyncIterator[bytes]:
        """response.created and .in_progress, each item's events as the answer grows, then
        response.completed or .incomplete; an error event if the request fails."""
        output = ResponseOutput(self.chat_format.calls)
        reader = self.reader(body, job, 0)
        for kind in ("response.created", "response.in_progress"):
            yield named_sse(output.event(ResponseLifecycleEvent, type=kind,
                                         response=self.response_object(job, body, [],
                                                                       "in_progress")))
        async with aclosing(self.outputs(job, http_request)) as outputs:
            async for prompt_index, engine_output in outputs:
                if engine_output.error:
                    error = failure(engine_output)
                    yield named_sse(output.event(ErrorEvent, code=error.code or error.type,
                                                 message=error.message, param=error.param))
                    return
                sample = job.record(prompt_index, engine_output)
                incomplete = engine_output.finish_reason is FinishReason.LENGTH
                answer = reader.read(sample.text, engine_output.finished)
                for event in output.advance(answer, engine_output.finished, incomplete):
                    yield named_sse(event)
        if job.done:
            status = final_status(job)
            yield named_sse(output.event(ResponseLifecycleEvent, type=f"response.{status}",
                                         response=self.response_object(job, body, output.items,
                                                                       status)))


def echo_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools as a response lists them (every key the schema requires; strict
    by default, as calls always follow the parameters' schema here)."""
    return [{"type": "function", "name": tool.get("name"),
             "description": tool.get("description"), "parameters": tool.get("parameters"),
             "strict": tool.get("strict", True)} for tool in tools]
