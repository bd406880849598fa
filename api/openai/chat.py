"""POST /v1/chat/completions: messages rendered with the model's chat template; with tools
(api/tools/plan.py), answers read back as tool calls."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from api.job import Job, Prompt, SampleResult
from api.openai.bodies import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    DeltaToolCall,
    FinishReason,
    FunctionCall,
    ToolCall,
)
from api.openai.protocol import ChatCompletionRequest
from api.serving import OpenAIServing
from api.tokenization import chat_prompt
from api.tools.calls import CallStream, is_call_text, new_call_id, scan
from engine.logprobs import TokenLogprobs
from engine.request import RequestOutput


@dataclass
class Calls:
    """An answer's tool calls; `complete`: whole calls, nothing cut off."""

    calls: list[ToolCall]
    complete: bool


class ChatServing(OpenAIServing[ChatCompletionRequest]):
    request_id_prefix = "chatcmpl"

    def prompts(self, body: ChatCompletionRequest) -> list[Prompt]:
        text = chat_prompt(self.tokenizer, body.messages, body.tool_plan(),
                           variables=body.template_variables())
        self.check_length(text, "messages")
        return [Prompt(self.tokenizer(text, add_special_tokens=False).input_ids)]

    def logprobs(self, body: ChatCompletionRequest,
                 entries: list[TokenLogprobs] | None) -> ChatChoiceLogprobs | None:
        if not body.logprobs:
            return None
        return ChatChoiceLogprobs(content=self.formatter.chat(entries or []))

    @staticmethod
    def may_call(body: ChatCompletionRequest) -> bool:
        plan = body.tool_plan()
        return plan is not None and plan.may_call

    def tool_calls(self, body: ChatCompletionRequest, text: str) -> Calls | None:
        """The answer's tool calls, None if it is text. An answer cut off inside a call (by
        max_tokens or a stop string) gives the calls whose names came, the last with the
        arguments that came: what the streamed deltas of the same answer join into."""
        if not self.may_call(body) or not is_call_text(text):
            return None
        found = scan(text)
        if not found.valid:  # not the grammar's format: cannot happen under its mask
            return None
        return Calls([ToolCall(id=new_call_id(), function=FunctionCall(
            name=call.name, arguments=call.arguments)) for call in found.calls
            if call.name is not None], found.complete)

    def response(self, job: Job, body: ChatCompletionRequest) -> ChatCompletionResponse:
        choices = []
        for index, sample in job.ranked(0):
            assert sample.last is not None
            calls = self.tool_calls(body, sample.text)
            if calls is None:
                message = ChatCompletionMessage(content=sample.text)
            else:  # no text; content "" when the answer was cut off before a call's name
                message = ChatCompletionMessage(content=None if calls.calls else "",
                                                tool_calls=calls.calls or None)
            choices.append(ChatCompletionChoice(
                index=index, message=message, logprobs=self.logprobs(body, sample.logprobs),
                finish_reason=finish(sample.last.finish_reason,
                                     calls is not None and calls.complete)))
        return ChatCompletionResponse(id=job.response_id, created=job.created, model=job.model,
                                      choices=choices, usage=job.usage())

    def opening_chunks(self, job: Job) -> list[BaseModel]:
        """The role comes first, in a chunk of its own per choice (as OpenAI sends it)."""
        return [self._chunk(job, index, DeltaMessage(role="assistant", content=""), None, None)
                for index in range(job.n)]

    def chunk(self, job: Job, body: ChatCompletionRequest, prompt_index: int,
              output: RequestOutput,
              sample: SampleResult) -> ChatCompletionStreamResponse | None:
        """None when the output brings nothing to send: no text (the tokens of a call's
        markup, a character not yet whole), no logprobs and no finish_reason."""
        index = job.choice_index(prompt_index, output.sample_index)
        logprobs = self.logprobs(body, output.logprobs)
        if self.may_call(body) and is_call_text(sample.text) is not False:
            # Calls, or nothing yet to tell: the calls' deltas so far, if any.
            stream = job.streams.setdefault(index, CallStream())
            entries = stream.deltas(sample.text)
            calls = [DeltaToolCall.model_validate(e) for e in entries] or None
            done = output.finish_reason is not None and scan(sample.text).complete
            if calls is None and logprobs is None and output.finish_reason is None:
                return None
            return self._chunk(job, index, DeltaMessage(tool_calls=calls),
                               finish(output.finish_reason, done), logprobs)
        if not output.text and logprobs is None and output.finish_reason is None:
            return None
        # The last chunk carries only finish_reason when no text came with it.
        content = output.text if output.text or output.finish_reason is None else None
        return self._chunk(job, index, DeltaMessage(content=content), output.finish_reason,
                           logprobs)

    def usage_chunk(self, job: Job) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=job.response_id, created=job.created,
                                            model=job.model, choices=[], usage=job.usage())

    def _chunk(self, job: Job, index: int, delta: DeltaMessage,
               finish_reason: FinishReason | None,
               logprobs: ChatChoiceLogprobs | None) -> ChatCompletionStreamResponse:
        choice = ChatCompletionStreamChoice(index=index, delta=delta, logprobs=logprobs,
                                            finish_reason=finish_reason)
        return ChatCompletionStreamResponse(id=job.response_id, created=job.created,
                                            model=job.model, choices=[choice])


def finish(reason: FinishReason | None, calls: bool) -> FinishReason | None:
    """An answer that ended as whole tool calls finishes with "tool_calls"."""
    return "tool_calls" if calls and reason == "stop" else reason
