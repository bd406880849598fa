"""POST /v1/completions: prompts as text or token ids, one or a list; echo; logprobs."""

from __future__ import annotations

from api.errors import APIError
from api.job import Job, Prompt, SampleResult
from api.openai.bodies import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    CompletionStreamResponse,
)
from api.openai.protocol import CompletionRequest
from api.serving import OpenAIServing
from engine.logprobs import TokenLogprobs
from engine.request import RequestOutput


class CompletionServing(OpenAIServing[CompletionRequest]):
    request_id_prefix = "cmpl"

    def prompts(self, body: CompletionRequest) -> list[Prompt]:
        vocab_size = len(self.tokenizer)
        prompts = []
        for prompt in body.prompts():
            if isinstance(prompt, str):
                self.check_length(prompt)
                ids = self.tokenizer(prompt).input_ids if prompt else []
                prompts.append(Prompt(ids, prompt))
            else:
                if any(not 0 <= t < vocab_size for t in prompt):
                    raise APIError(f"Token ids in 'prompt' must be in [0, {vocab_size}).",
                                   "prompt")
                prompts.append(Prompt(list(prompt)))
            if not prompts[-1].token_ids:
                raise APIError("The prompt is empty.", "prompt")
        return prompts

    def prompt_text(self, prompt: Prompt) -> str:
        """What echo shows: the prompt as sent, or its token ids decoded."""
        return prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids)

    def response(self, job: Job, body: CompletionRequest) -> CompletionResponse:
        choices = []
        for i, prompt in enumerate(job.prompts):
            for index, sample in job.ranked(i):
                assert sample.last is not None
                text = sample.text
                logprobs = None
                if body.logprobs is not None:
                    ids, entries = self._echoed(job, body, i)
                    echoed = len(ids)
                    ids += [e.token_id for e in sample.logprobs]
                    entries += sample.logprobs
                    logprobs, _ = self.formatter.completion(ids, entries, 0, echoed)
                if body.echo:
                    text = self.prompt_text(prompt) + text
                choices.append(CompletionChoice(index=index, text=text, logprobs=logprobs,
                                                finish_reason=sample.last.finish_reason))
        return CompletionResponse(id=job.response_id, created=job.created, model=job.model,
                                  choices=choices, usage=job.usage())

    def _echoed(self, job: Job, body: CompletionRequest,
                prompt_index: int) -> tuple[list[int], list[TokenLogprobs | None]]:
        """The prompt's tokens and logprobs, when echoed (empty lists otherwise)."""
        if not body.echo:
            return [], []
        return list(job.prompts[prompt_index].token_ids), list(job.prompt_logprobs[prompt_index])

    def chunk(self, job: Job, body: CompletionRequest, prompt_index: int,
              output: RequestOutput, sample: SampleResult) -> CompletionStreamResponse:
        """A sample's first chunk begins with the prompt (echo); logprobs are those of this
        chunk's tokens, offsets running on from the sample's previous chunk."""
        first = sample.num_outputs == 1
        text = output.text
        if body.echo and first:
            text = self.prompt_text(job.prompts[prompt_index]) + text
        logprobs: CompletionLogprobs | None = None
        if body.logprobs is not None:
            ids, entries = self._echoed(job, body, prompt_index) if first else ([], [])
            echoed = len(ids)
            ids += [e.token_id for e in output.logprobs or []]
            entries += output.logprobs or []
            logprobs, sample.text_offset = self.formatter.completion(
                ids, entries, sample.text_offset, echoed)
        choice = CompletionChoice(index=job.choice_index(prompt_index, output.sample_index),
                                  text=text, logprobs=logprobs,
                                  finish_reason=output.finish_reason)
        return CompletionStreamResponse(id=job.response_id, created=job.created,
                                        model=job.model, choices=[choice])

    def usage_chunk(self, job: Job) -> CompletionStreamResponse:
        return CompletionStreamResponse(id=job.response_id, created=job.created,
                                        model=job.model, choices=[], usage=job.usage())
