"""The FastAPI app: OpenAI-compatible completions and chat over any engine.

An engine here is anything with `add_request(Request)`, `abort(request_id)`,
`tokenizer`, `max_tokens_per_request` and `metrics` (see engine/batch_engine.py;
baseline_server.py provides another). The handler tokenizes and validates, hands
the request over, and turns the engine's outputs, which arrive through an
asyncio.Queue, into one SSE event per token or one JSON body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from itertools import takewhile
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from engine.batch_engine import QueueFullError
from engine.request import Request as EngineRequest
from engine.request import RequestOutput, SamplingParams

RETRY_AFTER_SECONDS = 1
log = logging.getLogger("nano_vllm.api")
DISCONNECT_CHECK_SECONDS = 1.0
# Below this a temperature is greedy (as in vLLM): dividing logits by a tinier one overflows.
GREEDY_TEMPERATURE = 1e-5


class APIError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, err_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = (
            message, param, status, code, err_type)


def error_body(message: str, err_type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status == 429 else None
    return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code),
                        status_code=exc.status, headers=headers)


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    if first.get("type") == "model_attributes_type" and isinstance(first.get("input"),
                                                                     str | bytes):
        # FastAPI leaves a body unparsed unless it comes as application/json (curl -d doesn't)
        return ("The request body must be a JSON object, sent with "
                "'Content-Type: application/json'.", None)
    # A value that fits no member of a union (prompt: str | list[int] | ...) fails once per
    # member, each loc ending in the member's name ('str'): name the field, list every reason.
    locs = [[str(p) for p in e.get("loc", ()) if p != "body"] for e in errors]
    group = [i for i, loc in enumerate(locs) if loc[:1] == locs[0][:1]]
    columns = zip(*(locs[i] for i in group))  # the k-th part of each loc, side by side
    path = [parts[0] for parts in takewhile(lambda parts: len(set(parts)) == 1, columns)]
    reasons = list(dict.fromkeys(errors[i].get("msg", "invalid") for i in group))
    param = ".".join(path) or None
    where = f"'{param}'" if param else "the request body"
    return f"Invalid value for {where}: {'; or '.join(reasons)}.", param


def create_app(engine, model_name: str) -> FastAPI:
    app = FastAPI(title="nano-vLLM", docs_url=None, redoc_url=None)
    tokenizer = engine.tokenizer
    created = int(time.time())
    model_names = {model_name, "default"}

    @app.exception_handler(APIError)
    async def on_api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(exc)
        return error_response(APIError(message, param))

    @app.exception_handler(Exception)
    async def on_unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in a request handler")
        return JSONResponse(error_body(f"Internal server error: {exc}", "server_error"),
                            status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        err_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), err_type), status_code=exc.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.is_alive:
            return JSONResponse(error_body("The engine thread has stopped.", "server_error"),
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "nano-vllm",
            "max_model_len": engine.max_tokens_per_request}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    def sampling_params(body: SamplingFields, max_tokens: int | None,
                        num_prompt_tokens: int) -> SamplingParams:
        if body.model is not None and body.model not in model_names:
            raise APIError(f"The model '{body.model}' does not exist; this server serves "
                           f"'{model_name}'.", "model", code="model_not_found")
        if body.n != 1:
            raise APIError("Only n=1 is supported.", "n")
        unsupported = {"presence_penalty": body.presence_penalty not in (None, 0),
                       "frequency_penalty": body.frequency_penalty not in (None, 0),
                       "repetition_penalty": body.repetition_penalty not in (None, 1),
                       "logit_bias": bool(body.logit_bias),
                       "best_of": body.best_of not in (None, 1),
                       "response_format": body.response_format not in (None, {"type": "text"})}
        for field, asked in unsupported.items():
            if asked:
                raise APIError(f"{field} is not supported by this server.", field)
        room = engine.max_tokens_per_request - num_prompt_tokens
        if room < 1:
            raise APIError(f"The prompt is {num_prompt_tokens} tokens; this server holds at most "
                           f"{engine.max_tokens_per_request} tokens per request (prompt + "
                           "completion).", "prompt", code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = room
        if max_tokens < 1:
            raise APIError("max_tokens must be at least 1.", "max_tokens")
        if max_tokens > room:
            raise APIError(f"The prompt ({num_prompt_tokens} tokens) plus max_tokens "
                           f"({max_tokens}) exceeds the {engine.max_tokens_per_request} tokens "
                           "this server holds per request. Shorten the prompt or lower "
                           "max_tokens.", "max_tokens", code="context_length_exceeded")
        temperature = 1.0 if body.temperature is None else body.temperature
        if not (math.isfinite(temperature) and temperature >= 0):  # NaN would fail the step
            raise APIError("temperature must be a finite number of at least 0.", "temperature")
        if temperature < GREEDY_TEMPERATURE:
            temperature = 0.0
        top_p = 1.0 if body.top_p is None else body.top_p
        if not 0 < top_p <= 1:
            raise APIError("top_p must be in (0, 1].", "top_p")
        top_k = body.top_k or 0
        if top_k < -1:
            raise APIError("top_k must be -1 or 0 (off), or a positive number.", "top_k")
        if not 0 <= body.min_tokens <= max_tokens:
            raise APIError("min_tokens must be between 0 and max_tokens.", "min_tokens")
        if body.seed is not None and not -(2**63) <= body.seed < 2**64:
            raise APIError("seed must be an integer in [-2**63, 2**64).", "seed")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if any(not s for s in stop):
            raise APIError("stop strings must not be empty.", "stop")
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for t in body.stop_token_ids or []):
            raise APIError(f"stop_token_ids must be token ids in [0, {vocab}).", "stop_token_ids")
        return SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
            seed=body.seed, stop=stop, stop_token_ids=list(body.stop_token_ids or []),
            ignore_eos=body.ignore_eos, min_tokens=body.min_tokens)

    def completion_prompt(body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError("Batched prompts are not supported; send one prompt per request.",
                               "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tokenizer(prompt).input_ids if prompt else []
        else:
            ids = list(prompt)
            if any(not 0 <= t < len(tokenizer) for t in ids):
                raise APIError(f"Token ids in 'prompt' must be in [0, {len(tokenizer)}).",
                               "prompt")
        if not ids:
            raise APIError("The prompt is empty.", "prompt")
        if body.echo or body.logprobs:
            raise APIError("echo and logprobs are not supported.", "echo" if body.echo
                           else "logprobs")
        return ids

    def chat_prompt(body: ChatCompletionRequest) -> list[int]:
        if body.logprobs:
            raise APIError("logprobs are not supported.", "logprobs")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False).input_ids

    def submit(prompt_ids: list[int], params: SamplingParams,
               prefix: str) -> tuple[str, asyncio.Queue[RequestOutput]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        request_id = f"{prefix}-{uuid.uuid4().hex}"

        def deliver(output: RequestOutput) -> None:  # called on the engine thread
            loop.call_soon_threadsafe(queue.put_nowait, output)

        try:
            engine.add_request(EngineRequest(request_id, prompt_ids, params, deliver))
        except QueueFullError as exc:
            raise APIError(f"{exc}; retry after {RETRY_AFTER_SECONDS} s.", status=429,
                           code="rate_limit_exceeded", err_type="rate_limit_error") from exc
        return request_id, queue

    async def outputs(request_id: str, queue: asyncio.Queue[RequestOutput],
                      http_request: Request) -> AsyncIterator[RequestOutput]:
        """The engine's outputs until the last; aborts the request if the client leaves.

        The client is checked at least every DISCONNECT_CHECK_SECONDS, also while outputs
        keep coming (a non-streaming handler would otherwise notice only at the end)."""
        finished = False
        checked = time.monotonic()
        try:
            while not finished:
                try:
                    output = await asyncio.wait_for(queue.get(), DISCONNECT_CHECK_SECONDS)
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
                engine.abort(request_id)

    def usage(last: RequestOutput) -> dict[str, int]:
        return {"prompt_tokens": last.num_prompt_tokens,
                "completion_tokens": last.num_output_tokens,
                "total_tokens": last.num_prompt_tokens + last.num_output_tokens}

    def engine_error(output: RequestOutput) -> APIError:
        return APIError(output.error or "internal error", status=500, err_type="server_error")

    async def respond(http_request: Request, body: SamplingFields, prompt_ids: list[int],
                      max_tokens: int | None, chat: bool) -> Any:
        params = sampling_params(body, max_tokens, len(prompt_ids))
        prefix, obj = ("chatcmpl", "chat.completion") if chat else ("cmpl", "text_completion")
        request_id, queue = submit(prompt_ids, params, prefix)
        stamp = int(time.time())
        head = {"id": request_id, "object": obj, "created": stamp, "model": model_name}

        if not body.stream:
            text, last = [], None
            async for output in outputs(request_id, queue, http_request):
                text.append(output.text)
                last = output
            if last is None or not last.finished:
                return Response(status_code=499)  # the client is gone; nobody reads this
            if last.error:
                raise engine_error(last)
            content = "".join(text)
            choice = ({"index": 0, "message": {"role": "assistant", "content": content},
                       "logprobs": None, "finish_reason": last.finish_reason} if chat else
                      {"index": 0, "text": content, "logprobs": None,
                       "finish_reason": last.finish_reason})
            return {**head, "choices": [choice], "usage": usage(last)}

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str, finish_reason: str | None) -> str:
            if chat:
                delta = {"content": text} if text or finish_reason is None else {}
                choice = {"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None,
                          "finish_reason": finish_reason}
            return json.dumps({**head, "object": chunk_obj, "choices": [choice]})

        async def events() -> AsyncIterator[dict[str, str]]:
            if chat:
                first = {**head, "object": chunk_obj, "choices": [{
                    "index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}]}
                yield {"data": json.dumps(first)}
            async for output in outputs(request_id, queue, http_request):
                if output.error:
                    yield {"data": json.dumps(error_body(output.error, "server_error"))}
                    break
                yield {"data": chunk(output.text, output.finish_reason)}
                if output.finished and include_usage:
                    yield {"data": json.dumps({**head, "object": chunk_obj, "choices": [],
                                               "usage": usage(output)})}
            yield {"data": "[DONE]"}

        return EventSourceResponse(events(), ping=15)

    @app.post("/v1/completions")
    async def completions(http_request: Request, body: CompletionRequest) -> Any:
        return await respond(http_request, body, completion_prompt(body), body.max_tokens,
                             chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http_request: Request, body: ChatCompletionRequest) -> Any:
        max_tokens = (body.max_completion_tokens if body.max_completion_tokens is not None
                      else body.max_tokens)  # None: as much as fits
        return await respond(http_request, body, chat_prompt(body), max_tokens, chat=True)

    return app
