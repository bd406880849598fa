"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

from pydantic import BaseModel

from api.job import Job, Prompt, SampleResult
from api.protocol import ChatCompletionRequest
from api.responses import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    FinishReason,
)
from api.serving import OpenAIServing
from api.tokenization import render_chat
from engine.logprobs import TokenLogprobs
from engine.request import RequestOutput


class ChatServing(OpenAIServing[ChatCompletionRequest]):
    request_id_prefix = "chatcmpl"

    def prompts(self, body: ChatCompletionRequest) -> list[Prompt]:
        text = render_chat(self.tokenizer, body.template_messages(), add_generation_prompt=True)
        return [Prompt(self.tokenizer(text, add_special_tokens=False).input_ids)]

    def logprobs(self, body: ChatCompletionRequest,
                 entries: list[TokenLogprobs] | None) -> ChatChoiceLogprobs | None:
        if not body.logprobs:
            return None
        return ChatChoiceLogprobs(content=self.formatter.chat(entries or []))

    def response(self, job: Job, body: ChatCompletionRequest) -> ChatCompletionResponse:
        choices = []
        for index, sample in job.ranked(0):
            assert sample.last is not None
            choices.append(ChatCompletionChoice(
                index=index, message=ChatCompletionMessage(content=sample.text),
                logprobs=self.logprobs(body, sample.logprobs),
                finish_reason=sample.last.finish_reason))
        return ChatCompletionResponse(id=job.response_id, created=job.created, model=job.model,
                                      choices=choices, usage=job.usage())

    def opening_chunks(self, job: Job) -> list[BaseModel]:
        """The role comes first, in a chunk of its own per choice (as OpenAI sends it)."""
        return [self._chunk(job, index, DeltaMessage(role="assistant", content=""), None, None)
                for index in range(job.n)]

    def chunk(self, job: Job, body: ChatCompletionRequest, prompt_index: int,
              output: RequestOutput, sample: SampleResult) -> ChatCompletionStreamResponse:
        # The last chunk carries only finish_reason when no text came with it.
        content = output.text if output.text or output.finish_reason is None else None
        return self._chunk(job, job.choice_index(prompt_index, output.sample_index),
                           DeltaMessage(content=content), output.finish_reason,
                           self.logprobs(body, output.logprobs))

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
