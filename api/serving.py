"""Completions and chat: from a validated request body to the engine and back.

OpenAIServing does what both endpoints share: check the body, submit one engine request per
prompt (each with its samples), then either collect every output into one JSON body or turn
each into one SSE event (chunks of different choices interleave, each with its index), and
abort every request when the client leaves. CompletionServing and ChatServing
(serving_completion.py, serving_chat.py) say how the prompts are built and what a response
and a stream chunk look like.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import replace
from typing import Any, ClassVar, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.answer import ChatFormat
from api.engine_client import EngineClient
from api.errors import APIError
from api.event_stream import DONE, EventStream, sse
from api.job import Job, Prompt, SampleResult
from api.limits import PromptBound
from api.logprobs import LogprobFormatter
from api.sampling import SamplingFields
from engine.admission import EngineUnavailableError, QueueFullError
from engine.request import ENGINE_FAILED, SHUTDOWN, FinishReason, RequestOutput, SamplingParams
from engine.request import Request as EngineRequest
from engine.structured.compiler import GrammarCompiler
from engine.structured.grammar import CompiledGrammar, GrammarError, GrammarSpec

# A client that left is noticed within this long, also while outputs keep coming.
DISCONNECT_CHECK_SECONDS = 1.0
SSE_PING_SECONDS = 15
REQUEST_ID_HEADER = "X-Request-Id"

Body = TypeVar("Body", bound=SamplingFields)


def failure(output: RequestOutput) -> APIError:
    """The error a failed output ends its request with: 504 if its deadline passed (before
    any token was sent, as a non-streamed answer has sent none), 503 when the server could
    not finish it (shut down before it ended, or the engine died), else 500."""
    if output.finish_reason is FinishReason.TIMEOUT:
        return APIError(output.error or "request timed out", status=504,
                        code="request_timeout", err_type="timeout_error")
    if output.error_code in (SHUTDOWN, ENGINE_FAILED):
        return APIError(output.error or "", status=503, code=output.error_code,
                        err_type="server_error")
    return APIError(output.error or "internal error", status=500, err_type="server_error")


class Arrivals:
    """How many requests an app's endpoints are checking and tokenizing: each request handed
    to the engine says how many are behind it, so that an idle engine's first step waits for
    a burst's rest (engine/arrivals.py). One per app, counted on its event loop's thread.
    A request whose grammar compiles after that is not counted: it may take seconds."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def taken_in(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1


async def remind(queue: asyncio.Queue[Any], seconds: float) -> None:
    """Put None in `queue` every `seconds`, until cancelled."""
    while True:
        await asyncio.sleep(seconds)
        queue.put_nowait(None)


class EngineRequests:
    """A job's prompts handed to the engine, one request each, and their outputs read back
    until every one has finished; what every endpoint that runs the engine shares."""

    request_id_prefix: ClassVar[str]
    engine: EngineClient
    model_name: str
    accepted_model_names: set[str]

    def check_model_name(self, name: str) -> None:
        if name not in self.accepted_model_names:
            raise APIError(f"The model '{name}' does not exist; this server serves "
                           f"'{self.model_name}'.", "model", status=404, code="model_not_found")

    def submit(self, job: Job, params: list[SamplingParams], timeout: float | None = None,
               priority: int = 0, behind: int = 0) -> None:
        """One engine request per prompt (unique ids, whatever the client's id); outputs go
        to job.queue tagged with their prompt's index. `timeout`: the request's own deadline,
        seconds from now; `behind`: other requests taken in and not yet submitted. All or none
        are submitted: a full line is a 429 with the engine's Retry-After, an engine that
        takes no requests (it is shutting down, or dead) a 503."""
        loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()
        engine_id = f"{self.request_id_prefix}-{uuid.uuid4().hex}"
        for i, (prompt, prompt_params) in enumerate(zip(job.prompts, params, strict=True)):
            def deliver(output: RequestOutput, i: int = i) -> None:
                if threading.get_ident() == loop_thread:  # read on the loop (outputs_on)
                    job.queue.put_nowait((i, output))
                else:  # on the engine's thread
                    loop.call_soon_threadsafe(job.queue.put_nowait, (i, output))

            request_id = f"{engine_id}-{i}"
            try:
                self.engine.add_request(EngineRequest(
                    request_id, prompt.token_ids, prompt_params, deliver, timeout=timeout,
                    priority=priority, arrivals_behind=behind + len(job.prompts) - 1 - i))
            except QueueFullError as exc:
                for submitted in job.request_ids:
                    self.engine.abort(submitted)
                raise APIError(f"{exc}; retry after {exc.retry_after} s.", status=429,
                               code="rate_limit_exceeded", err_type="rate_limit_error",
                               retry_after=exc.retry_after) from exc
            except EngineUnavailableError as exc:
                for submitted in job.request_ids:
                    self.engine.abort(submitted)
                raise APIError(str(exc), status=503, code="service_unavailable",
                               err_type="server_error") from exc
            job.request_ids.append(request_id)

    async def outputs(self, job: Job,
                      http_request: Request) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) until every sample has finished or one failed; aborts
        every request if the client leaves (or the caller stops early).

        The client is checked every DISCONNECT_CHECK_SECONDS, also while outputs keep coming
        (a non-streaming handler would otherwise notice only at the end): a reminder task
        puts None in the queue that often, which costs nothing per output (a timeout on
        each wait for the queue would cost a timer, or a task, per token)."""
        remaining = len(job.prompts) * job.num_samples
        reminder = asyncio.create_task(remind(job.queue, DISCONNECT_CHECK_SECONDS))
        try:
            while remaining:
                item = await job.queue.get()
                if item is None:
                    if await http_request.is_disconnected():
                        return
                else:
                    remaining -= item[1].finished
                    yield item
        finally:
            reminder.cancel()
            if remaining:
                for request_id in job.request_ids:
                    self.engine.abort(request_id)


class OpenAIServing(EngineRequests, ABC, Generic[Body]):
    """One generating endpoint; subclasses fill in the prompts and the response shapes."""

    request_id_separator: ClassVar[str] = "-"  # between the prefix and the request's id

    def __init__(self, engine: EngineClient, model_name: str,
                 grammars: GrammarCompiler | None = None,
                 prompt_bound: PromptBound | None = None,
                 arrivals: Arrivals | None = None, accept_unknown_fields: bool = False,
                 chat_format: ChatFormat | None = None) -> None:
        self.engine = engine
        # The model's thinking and tool-call conventions (api/answer.py): from its chat
        # template, unless the server was told otherwise.
        self.chat_format = chat_format or ChatFormat.of(engine.tokenizer)
        self.accept_unknown_fields = accept_unknown_fields  # else such a field is a 400
        self.arrivals = arrivals or Arrivals()  # create_app shares one among its endpoints
        self.grammars = grammars or GrammarCompiler(engine.tokenizer)
        self.prompt_bound = prompt_bound or PromptBound(engine.tokenizer)
        self.tokenizer = engine.tokenizer
        self.formatter = LogprobFormatter(engine.tokenizer)
        self.model_name = model_name
        self.accepted_model_names = {model_name, "default"}

    async def create(self, body: Body, http_request: Request) -> Response:
        """Validate, submit, and answer with one JSON body or an SSE stream."""
        job = await self.take_in(body, http_request)
        if body.stream:
            return EventStream(self.events(job, body, http_request), ping=SSE_PING_SECONDS,
                               headers=self.id_headers(job))
        return await self.collect(job, body, http_request, self.id_headers(job))

    def id_headers(self, job: Job) -> dict[str, str]:
        """The response's headers that carry the request's id."""
        return {REQUEST_ID_HEADER: job.client_id}

    async def take_in(self, body: Body, http_request: Request) -> Job:
        """Check the request, tokenize it and hand it to the engine: its job."""
        with self.arrivals.taken_in():  # requests handed over meanwhile announce this one
            self.check_model(body)
            body.check_supported(self.accept_unknown_fields)
            body.check_samples(self.engine.max_num_seqs)
            body.check_priority(self.engine.scheduling_policy)
            # Tokenizing (and rendering a chat template) takes time in the prompt's length: on
            # a worker thread, so that other requests' streams keep flowing meanwhile.
            prompts = await run_in_threadpool(self.prompts, body)
        params = [self.engine_params(body, p, body.to_sampling_params(
            len(p.token_ids), self.engine.max_tokens_per_request, len(self.tokenizer)))
            for p in prompts]
        spec = self.grammar_spec(body)
        if spec is not None:
            grammar = await self.compile_grammar(spec)
            params = [replace(p, grammar=grammar) for p in params]
        client_id = http_request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        job = Job(f"{self.request_id_prefix}{self.request_id_separator}{client_id}",
                  self.model_name, prompts, body.n, body.num_samples(), client_id=client_id)
        self.submit(job, params, body.request_timeout, body.priority, self.arrivals.count)
        return job

    async def compile_grammar(self, spec: GrammarSpec) -> CompiledGrammar:
        """The spec compiled off the engine thread (or cached); a 400 naming the problem
        when it is invalid, unsupported, too large or too slow to compile."""
        field = spec.source or "response_format"
        try:
            return await self.grammars.compile(spec)
        except GrammarError as exc:
            raise APIError(f"The structured output in {field} cannot be used: "
                           f"{str(exc).strip()}.",
                           field) from exc

    def check_model(self, body: Body) -> None:
        if body.model is not None:
            self.check_model_name(body.model)
        if self.engine.embedding_info is not None:
            raise APIError(f"The model '{self.model_name}' is an embedding model: it generates "
                           "no text. Ask it on /v1/embeddings, /v1/rerank or /v1/score.",
                           "model", code="model_not_generative")

    async def collect(self, job: Job, body: Body, http_request: Request,
                      headers: dict[str, str]) -> Response:
        """The whole answer as one JSON body, once the last output is in."""
        async with aclosing(self.outputs(job, http_request)) as outputs:
            async for prompt_index, output in outputs:
                if output.error:
                    raise failure(output)
                job.record(prompt_index, output)
        if not job.done:
            return Response(status_code=499)  # the client is gone; nobody reads this
        response = self.response(job, body)
        response.timing = job.timing()  # type: ignore[attr-defined]
        headers = {**headers, "Server-Timing": job.server_timing()}
        return JSONResponse(response.model_dump(), headers=headers)

    async def events(self, job: Job, body: Body,
                     http_request: Request) -> AsyncIterator[bytes]:
        """One SSE event per output that brings something (so about one per token and
        choice), usage if asked, then [DONE]."""
        for chunk in self.opening_chunks(job):
            yield sse(chunk)
        async with aclosing(self.outputs(job, http_request)) as outputs:
            async for prompt_index, output in outputs:
                if output.error:
                    yield sse(failure(output).body())
                    break
                sample = job.record(prompt_index, output)
                chunk = self.chunk(job, body, prompt_index, output, sample)
                if chunk is None:
                    continue
                if body.continuous_usage:
                    chunk.usage = job.usage()  # type: ignore[attr-defined]
                yield sse(chunk)
        if job.done and body.include_usage:
            yield sse(self.usage_chunk(job))
        yield DONE

    # --- what each endpoint fills in ---------------------------------------------------------

    def engine_params(self, body: Body, prompt: Prompt,
                      params: SamplingParams) -> SamplingParams:
        """A prompt's sampling parameters, with what the endpoint adds (chat: thinking)."""
        return params

    def grammar_spec(self, body: Body) -> GrammarSpec | None:
        """The constraint on the answer, if the body asks for one."""
        return body.grammar_spec()

    @abstractmethod
    def prompts(self, body: Body) -> list[Prompt]:
        """The prompts' token ids; APIError if one is empty, has ids out of range, or is a
        text too long to fit (checked before it is tokenized: check_length). Runs on a
        worker thread."""

    def check_length(self, text: str, param: str = "prompt") -> None:
        """APIError naming `param` if `text` is longer than any prompt that fits, before
        tokenizing it."""
        self.prompt_bound.check(text, self.engine.max_tokens_per_request, param)

    @abstractmethod
    def response(self, job: Job, body: Body) -> BaseModel:
        """The non-streamed body, from a job that is done."""

    def opening_chunks(self, job: Job) -> list[BaseModel]:
        """Chunks sent before the first output."""
        return []

    @abstractmethod
    def chunk(self, job: Job, body: Body, prompt_index: int, output: RequestOutput,
              sample: SampleResult) -> BaseModel | None:
        """The stream chunk of one output (already recorded in `sample`); None: nothing in
        it to send."""

    @abstractmethod
    def usage_chunk(self, job: Job) -> BaseModel:
        """The stream's last chunk when usage is asked for: no choices, only usage."""
