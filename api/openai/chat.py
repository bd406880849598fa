"""POST /v1/chat/completions: messages rendered with the model's chat template; answers read
into their thinking, text and tool calls (api/answer.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import BaseModel

from api.answer import Answer, AnswerReader
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
from api.thinking import SplitStream
from api.tokenization import chat_prompt
from api.tools.calls import CallStream, new_call_id
from engine.logprobs import TokenLogprobs
from engine.request import RequestOutput, SamplingParams
from engine.structured.grammar import GrammarSpec


@dataclass
class Calls:
    """An answer's tool calls; `complete`: whole calls, nothing cut off."""

    calls: list[ToolCall]
    complete: bool


@dataclass
class ChoiceStream:
    """How one streamed choice is read, and what it has sent: of its reasoning and
    content, and of its calls."""

    reader: AnswerReader
    parts: SplitStream
    calls: CallStream


class ChatServing(OpenAIServing[ChatCompletionRequest]):
    request_id_prefix = "chatcmpl"

    def prompts(self, body: ChatCompletionRequest) -> list[Prompt]:
        text = chat_prompt(self.tokenizer, body.messages, body.tool_plan(),
                           variables=body.template_variables(), form=self.chat_format.calls)
        self.check_length(text, "messages")
        parser = self.chat_format.reasoning
        return [Prompt(self.tokenizer(text, add_special_tokens=False).input_ids,
                       thinking="free" if parser is None else parser.prompt_state(text))]

    def engine_params(self, body: ChatCompletionRequest, prompt: Prompt,
                      params: SamplingParams) -> SamplingParams:
        """With the model's thinking tags and the budget, where the model thinks (and the
        prompt has not switched its thinking off)."""
        parser = self.chat_format.reasoning
        if parser is None or prompt.thinking == "done":
            return params
        budget = body.thinking_token_budget
        if budget is None:
            budget = self.chat_format.thinking_budget
        return replace(params, thinking=parser.engine_params(self.tokenizer,
                                                             prompt.thinking == "open", budget))

    def grammar_spec(self, body: ChatCompletionRequest) -> GrammarSpec | None:
        return body.grammar_spec(self.chat_format.calls)

    def logprobs(self, body: ChatCompletionRequest,
                 entries: list[TokenLogprobs] | None) -> ChatChoiceLogprobs | None:
        if not body.logprobs:
            return None
        return ChatChoiceLogprobs(content=self.formatter.chat(entries or []))

    @staticmethod
    def may_call(body: ChatCompletionRequest) -> bool:
        plan = body.tool_plan()
        return plan is not None and plan.may_call

    def reader(self, body: ChatCompletionRequest, job: Job, prompt_index: int) -> AnswerReader:
        """How the answers to one of the job's prompts are read into their parts."""
        plan = body.tool_plan()
        bare = ({tool.name: tool.parameters for tool in plan.callable}
                if plan is not None and plan.mode == "auto" else None)
        return AnswerReader(self.chat_format, self.may_call(body),
                            job.prompts[prompt_index].thinking, bare)

    def tool_calls(self, reader: AnswerReader, answer: Answer) -> Calls | None:
        """The answer's tool calls, None if it has none. An answer cut off inside a call (by
        max_tokens or a stop string) gives the calls whose names came, the last with the
        arguments that came: what the streamed deltas of the same answer join into."""
        if answer.calls is None:
            return None
        found = reader.scan(answer.calls)
        if not found.valid:  # not the grammar's format: cannot happen under its mask
            return None
        return Calls([ToolCall(id=new_call_id(), function=FunctionCall(
            name=call.name, arguments=call.arguments)) for call in found.calls
            if call.name is not None], found.complete)

    def response(self, job: Job, body: ChatCompletionRequest) -> ChatCompletionResponse:
        choices = []
        reader = self.reader(body, job, 0)
        for index, sample in job.ranked(0):
            assert sample.last is not None
            answer = reader.read(sample.text, finished=True)
            calls = self.tool_calls(reader, answer)
            content: str | None = answer.content
            if calls is not None and calls.calls and not content:
                content = None  # the answer is calls only
            message = ChatCompletionMessage(
                content=content, tool_calls=calls.calls or None if calls else None,
                reasoning_content=answer.reasoning, reasoning=answer.reasoning)
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
        markup, a character or a tag not yet whole), no logprobs and no finish_reason."""
        index = job.choice_index(prompt_index, output.sample_index)
        logprobs = self.logprobs(body, output.logprobs)
        stream = job.streams.get(index)
        if stream is None:  # the choice's first output: its reader is made once
            stream = job.streams[index] = ChoiceStream(
                self.reader(body, job, prompt_index), SplitStream(),
                CallStream(self.chat_format.calls))
        reader = stream.reader
        answer = reader.read(sample.text, output.finished)
        reasoning, content = stream.parts.deltas(answer.reasoning, answer.content)
        entries = [] if answer.calls is None else stream.calls.deltas(answer.calls)
        calls = [DeltaToolCall.model_validate(e) for e in entries] or None
        done = (output.finish_reason is not None and answer.calls is not None
                and reader.scan(answer.calls).complete)  # (only the last chunk asks)
        if (not reasoning and not content and calls is None and logprobs is None
                and output.finish_reason is None):
            return None
        delta = DeltaMessage(content=content or None, tool_calls=calls,
                             reasoning_content=reasoning or None, reasoning=reasoning or None)
        return self._chunk(job, index, delta, finish(output.finish_reason, done), logprobs)

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
