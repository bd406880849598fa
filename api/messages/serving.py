"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat
path. The body becomes a chat request (api/messages/to_chat.py) and runs as chat
completions run (rendering, tool grammar, call parsing: ChatServing's); only the answer's
shapes are Anthropic's (api/messages/bodies.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from pydantic_core import from_json
from starlette.concurrency import run_in_threadpool

from api.answer import Answer
from api.event_stream import named_sse
from api.job import Job
from api.messages.bodies import (
    ContentBlock,
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    InputJSONDelta,
    MessageDelta,
    MessageDeltaEvent,
    MessageDeltaUsage,
    MessageResponse,
    MessageStartEvent,
    MessageStopEvent,
    MessageUsage,
    StopReason,
    TextContent,
    TextDelta,
    ThinkingContent,
    ThinkingDelta,
    TokenCount,
    ToolUseContent,
    anthropic_error_body,
)
from api.messages.protocol import CountTokensRequest, MessagesRequest
from api.messages.to_chat import to_chat
from api.openai.chat import ChatServing
from api.openai.protocol import ChatCompletionRequest
from api.serving import failure
from api.thinking import SplitStream
from api.tools.calls import CallStream
from api.tools.formats import CallFormat
from engine.request import FinishReason, RequestOutput


def partial_input(arguments: str) -> dict:
    """A tool_use block's input from its arguments' JSON text, which a cut-off answer ends
    early: what of it parses (a string or number cut off in the middle is left out), as the
    SDK builds it from the streamed input_json_delta pieces."""
    value = from_json(arguments, allow_partial=True) if arguments else {}
    return value if isinstance(value, dict) else {}


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def input_counts(job: Job) -> dict[str, int]:
    """The prompt's tokens split as Anthropic's usage splits them: those computed for this
    request (input_tokens) and those the prefix cache held (cache_read_input_tokens)."""
    cached = job.cached_tokens.get(0, 0)
    return {"input_tokens": len(job.prompts[0].token_ids) - cached,
            "cache_read_input_tokens": cached}


def stop_reason(last: RequestOutput, calls: bool) -> tuple[StopReason, str | None]:
    """Why the answer ended, and the stop sequence that ended it, if one did."""
    if last.finish_reason == FinishReason.LENGTH:
        return "max_tokens", None
    if last.stop_string is not None:
        return "stop_sequence", last.stop_string
    return ("tool_use" if calls else "end_turn"), None


class MessagesServing(ChatServing):
    request_id_prefix = "msg"

    async def create_message(self, body: MessagesRequest, http_request: Request) -> Response:
        return await self.create(to_chat(body, self.accept_unknown_fields), http_request)

    async def count_tokens(self, body: CountTokensRequest) -> TokenCount:
        """The rendered prompt's tokens, tools included, as /v1/messages would run it."""
        chat = to_chat(body, self.accept_unknown_fields)
        self.check_model(chat)
        prompts = await run_in_threadpool(self.prompts, chat)
        return TokenCount(input_tokens=len(prompts[0].token_ids))

    def id_headers(self, job: Job) -> dict[str, str]:
        """Also request-id, where the anthropic SDK reads a response's id from."""
        return {**super().id_headers(job), "request-id": job.client_id}

    @staticmethod
    def message_id(job: Job) -> str:
        prefix = MessagesServing.request_id_prefix + MessagesServing.request_id_separator
        return "msg_" + job.response_id.removeprefix(prefix)

    def response(self, job: Job, body: ChatCompletionRequest) -> MessageResponse:
        sample = job.samples[0, 0]
        assert sample.last is not None
        reader = self.reader(body, job, 0)
        answer = reader.read(sample.text, finished=True)
        calls = self.tool_calls(reader, answer)
        content: list[ContentBlock] = []
        if answer.reasoning:
            content.append(ThinkingContent(thinking=answer.reasoning))
        if answer.content:
            content.append(TextContent(text=answer.content))
        for call in calls.calls if calls else []:
            content.append(ToolUseContent(id=new_tool_use_id(), name=call.function.name,
                                          input=partial_input(call.function.arguments)))
        reason, sequence = stop_reason(sample.last, calls is not None and calls.complete)
        return self.message(job, content, reason, sequence, sample.num_output_tokens)

    def message(self, job: Job, content: list[ContentBlock],
                reason: StopReason | None, sequence: str | None,
                output_tokens: int) -> MessageResponse:
        return MessageResponse(id=self.message_id(job), content=content, model=job.model,
                               stop_reason=reason, stop_sequence=sequence,
                               usage=MessageUsage(**input_counts(job),
                                                  output_tokens=output_tokens))

    async def events(self, job: Job, body: ChatCompletionRequest,
                     http_request: Request) -> AsyncIterator[bytes]:
        """message_start, each block's start, deltas and stop, message_delta, message_stop;
        an `error` event (Anthropic's shape) if the request fails on the way.

        message_start waits for the first output, which says how much of the prompt the
        prefix cache held (its usage splits the prompt as the final counts do)."""
        reader = self.reader(body, job, 0)
        blocks = BlockStream(reader.form.calls)
        async with aclosing(self.outputs(job, http_request)) as outputs:
            async for prompt_index, output in outputs:
                if output.error:
                    error = failure(output)
                    body_json = anthropic_error_body(error.status, error.message, error.param,
                                                     error.code)
                    yield named_sse(body_json, "error")
                    return
                started = bool(job.samples)
                sample = job.record(prompt_index, output)
                if not started:
                    message = self.message(job, [], None, None, 0)
                    yield named_sse(MessageStartEvent(message=message))
                for block_event in blocks.advance(reader.read(sample.text, output.finished)):
                    yield named_sse(block_event)
        if not job.done:
            return  # the client left
        sample = job.samples[0, 0]
        assert sample.last is not None
        for block_event in blocks.close():
            yield named_sse(block_event)
        calls = reader.read(sample.text, finished=True).calls
        reason, sequence = stop_reason(sample.last,
                                       calls is not None and reader.scan(calls).complete)
        yield named_sse(MessageDeltaEvent(delta=MessageDelta(stop_reason=reason,
                                                         stop_sequence=sequence),
                                      usage=MessageDeltaUsage(
                                          **input_counts(job),
                                          output_tokens=sample.num_output_tokens)))
        yield named_sse(MessageStopEvent())


class BlockStream:
    """One streamed answer's content blocks: thinking, text, then a tool_use block per call
    (read by CallStream, as chat's streamed tool calls are), each as its part comes."""

    def __init__(self, form: CallFormat) -> None:
        self.parts = SplitStream()
        self.calls = CallStream(form)
        self.open: int | None = None  # the index of the block still open
        self.open_type: str | None = None
        self.started = 0  # blocks started so far
        self.call_blocks: dict[int, int] = {}  # a call's index -> its block's

    def advance(self, answer: Answer) -> list[BaseModel]:
        """The events that bring the client up to `answer` (the answer so far)."""
        reasoning, text = self.parts.deltas(answer.reasoning, answer.content)
        events: list[BaseModel] = []
        if reasoning:
            events += self.open_block(ThinkingContent(thinking=""))
            events.append(ContentBlockDeltaEvent(index=self.open,
                                                 delta=ThinkingDelta(thinking=reasoning)))
        if text:
            events += self.open_block(TextContent(text=""))
            events.append(ContentBlockDeltaEvent(index=self.open, delta=TextDelta(text=text)))
        if answer.calls is not None:
            events += self.call_events(answer.calls)
        return events

    def open_block(self, block: ThinkingContent | TextContent) -> list[BaseModel]:
        """The events that make a block of this type the open one, if it is not."""
        if self.open is not None and self.open_type == block.type:
            return []
        return [*self.close(), self.start(block)]

    def call_events(self, text: str) -> list[BaseModel]:
        events: list[BaseModel] = []
        for entry in self.calls.deltas(text):
            if "id" in entry:  # a call's first entry: its name
                events += self.close()
                events.append(self.start(ToolUseContent(
                    id=new_tool_use_id(), name=entry["function"]["name"], input={})))
                self.call_blocks[entry["index"]] = self.open  # type: ignore[assignment]
            else:
                events.append(ContentBlockDeltaEvent(
                    index=self.call_blocks[entry["index"]],
                    delta=InputJSONDelta(partial_json=entry["function"]["arguments"])))
        return events

    def start(self, block: ContentBlock) -> ContentBlockStartEvent:
        self.open, self.open_type = self.started, block.type
        self.started += 1
        return ContentBlockStartEvent(index=self.open, content_block=block)

    def close(self) -> list[BaseModel]:
        """The open block's stop, if one is open."""
        if self.open is None:
            return []
        index, self.open, self.open_type = self.open, None, None
        return [ContentBlockStopEvent(index=index)]
