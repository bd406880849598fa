"""The FastAPI app: routes and error handlers over any engine (api/engine_client.py).

The generating endpoints are api/serving.py's; request bodies are api/protocol.py's,
response bodies api/openai/bodies.py's, and every error leaves as OpenAI's envelope
(api/errors.py); Anthropic's Messages API (/v1/messages) has its own of each
(api/messages/protocol.py, api/messages/bodies.py, api/messages/serving.py). Who may
call which route is api/security.py's; what /openapi.json says, api/openapi.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.dashboard.routes import dashboard_router
from api.engine_client import EngineClient
from api.errors import APIError, describe_validation_error, error_body, error_response
from api.limits import BodySizeLimit, PromptBound, default_max_request_bytes
from api.messages.bodies import STREAM_EVENTS as MESSAGE_EVENTS
from api.messages.bodies import MessageResponse, TokenCount
from api.messages.protocol import CountTokensRequest, MessagesRequest
from api.messages.serving import MessagesServing
from api.openai.bodies import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionResponse,
    CompletionStreamResponse,
    DetokenizeResponse,
    HealthStatus,
    ModelCard,
    ModelList,
    TokenizeResponse,
)
from api.openai.chat import ChatServing
from api.openai.completions import CompletionServing
from api.openapi import (
    anthropic_error_responses,
    anthropic_responses,
    error_responses,
    generation_responses,
    honest_openapi,
    named_event_responses,
    text_response,
)
from api.protocol import ChatCompletionRequest, CompletionRequest
from api.responses.objects import STREAM_EVENTS as RESPONSE_EVENTS
from api.responses.objects import ResponseObject
from api.responses.protocol import ResponsesRequest
from api.responses.serving import ResponsesServing
from api.security import AccessConfig, guard, install_access
from api.serving import REQUEST_ID_HEADER, Arrivals
from api.tokenization import DetokenizeRequest, TokenizationServing, TokenizeRequest
from engine.structured.compiler import DEFAULT_COMPILE_TIMEOUT_S, GrammarCompiler

log = logging.getLogger("nano_vllm.api")


async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
    response = error_response(exc, request.url.path, exc.headers)  # e.g. a 401's
    if REQUEST_ID_HEADER in request.headers:  # echoed back, as on a success
        response.headers[REQUEST_ID_HEADER] = request.headers[REQUEST_ID_HEADER]
    return response


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = describe_validation_error(exc)
    return error_response(APIError(message, param), request.url.path)


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own errors (404 unknown path, 405 wrong method) in the route's shape, with
    the exception's headers (a 405's Allow)."""
    err_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(APIError(str(exc.detail), status=exc.status_code, err_type=err_type),
                          request.url.path, exc.headers)


async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error in a request handler")
    return error_response(APIError(f"Internal server error: {exc}", status=500,
                                   err_type="server_error"), request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as OpenAI's envelope (Anthropic's shape on /v1/messages...),
    whoever raised it."""
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected_error)


def create_app(engine: EngineClient, model_name: str, access: AccessConfig | None = None,
               grammar_timeout: float = DEFAULT_COMPILE_TIMEOUT_S,
               max_request_bytes: int | None = None,
               accept_unknown_fields: bool = False) -> FastAPI:
    """The app; structured outputs' grammars must compile within `grammar_timeout` s, a
    body over `max_request_bytes` is a 413 (None: api/limits.py's default for this engine),
    and a request field no API defines is a 400 unless `accept_unknown_fields`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with engine.outputs_on(asyncio.get_running_loop()):
            yield

    app = FastAPI(title="nano-vLLM", version="1", docs_url=None, redoc_url=None,
                  lifespan=lifespan,
                  description="An OpenAI-compatible server. Errors come as OpenAI's envelope "
                              "{\"error\": {message, type, param, code}}; on /v1/messages "
                              "(Anthropic's Messages API) as Anthropic's {\"type\": "
                              "\"error\", \"error\": {type, message}}.")
    app.openapi = lambda: honest_openapi(app, [CompletionStreamResponse,
                                               ChatCompletionStreamResponse, *RESPONSE_EVENTS,
                                               *MESSAGE_EVENTS],
                                         len(engine.tokenizer), [model_name, "default"])
    bound = PromptBound(engine.tokenizer)
    if max_request_bytes is None:
        max_request_bytes = default_max_request_bytes(engine.max_tokens_per_request, bound)
    app.state.max_request_bytes = max_request_bytes
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)  # inside CORS: its 413
    install_access(app, access or AccessConfig())                   # carries CORS headers
    install_error_handlers(app)
    grammars = GrammarCompiler(engine.tokenizer, grammar_timeout)  # one cache for both
    arrivals = Arrivals()  # requests being checked, for every endpoint (engine/arrivals.py)
    shared = (grammars, bound, arrivals, accept_unknown_fields)
    completion_serving = CompletionServing(engine, model_name, *shared)
    chat_serving = ChatServing(engine, model_name, *shared)
    responses_serving = ResponsesServing(engine, model_name, *shared)
    messages_serving = MessagesServing(engine, model_name, *shared)
    tokenization = TokenizationServing(engine, completion_serving.accepted_model_names)
    created = int(time.time())
    guarded = guard(app)
    probe = guard(app, guarded=bool(access and access.protect_health_metrics))
    auth = (401,) if guarded else ()  # documented only where a key is asked for
    probe_auth = (401,) if probe else ()

    @app.get("/health", dependencies=probe, response_model=HealthStatus,
             responses=error_responses(503, *probe_auth))
    async def health() -> JSONResponse:
        reason = engine.unavailable_reason  # shutting down, or the engine thread died
        if reason is not None:
            body = error_body(reason, "server_error", code="service_unavailable")
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse({"status": "ok"})

    card = ModelCard(id=model_name, created=created, display_name=model_name,
                     created_at=datetime.fromtimestamp(created, UTC).isoformat(),
                     max_model_len=engine.max_tokens_per_request, model_type=engine.model_type,
                     max_position_embeddings=engine.max_position_embeddings)

    @app.get("/v1/models", dependencies=guarded, responses=error_responses(400, *auth))
    async def models(after_id: str | None = None, before_id: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> ModelList:
        """The one model; Anthropic's page parameters: a page after or before it is empty
        (so a client paging by hand stops), `limit` (1 to 1000) changes nothing."""
        if after_id is not None or before_id is not None:
            return ModelList(data=[])
        return ModelList(data=[card], first_id=card.id, last_id=card.id)

    @app.get("/v1/models/{model_id:path}", dependencies=guarded,
             responses=error_responses(404, *auth))
    async def model(model_id: str) -> ModelCard:
        """The served model, by its name or "default"."""
        if not model_id:  # "/v1/models/": the list, as before this route took the path
            return RedirectResponse("/v1/models")
        completion_serving.check_model_name(model_id)
        return card

    @app.get("/metrics", dependencies=probe, response_class=Response,
             responses={**text_response("Prometheus' text exposition format, version 0.0.4."),
                        **error_responses(*probe_auth)})
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    # HEAD where a probe may send it instead of GET (uptime monitors do): the same status and
    # headers, and uvicorn sends no body.
    for path, endpoint, dependencies in (("/health", health, probe),
                                          ("/v1/models", models, guarded),
                                          ("/v1/models/{model_id:path}", model, guarded),
                                          ("/metrics", metrics, probe)):
        app.add_api_route(path, endpoint, methods=["HEAD"], dependencies=dependencies,
                          include_in_schema=False)

    @app.post("/v1/completions", dependencies=guarded, response_model=None,
              responses=generation_responses(CompletionResponse, CompletionStreamResponse,
                                             *auth))
    async def completions(http_request: Request, body: CompletionRequest) -> Response:
        return await completion_serving.create(body, http_request)

    @app.post("/v1/chat/completions", dependencies=guarded, response_model=None,
              responses=generation_responses(ChatCompletionResponse,
                                             ChatCompletionStreamResponse, *auth))
    async def chat_completions(http_request: Request, body: ChatCompletionRequest) -> Response:
        return await chat_serving.create(body, http_request)

    @app.post("/v1/responses", dependencies=guarded, response_model=None,
              responses=named_event_responses(ResponseObject, RESPONSE_EVENTS, *auth))
    async def responses(http_request: Request, body: ResponsesRequest) -> Response:
        return await responses_serving.create_response(body, http_request)

    # Anthropic's Messages API, over the chat path; errors in Anthropic's shape.
    @app.post("/v1/messages", dependencies=guarded, response_model=None,
              responses=anthropic_responses(MessageResponse, *auth))
    async def messages(http_request: Request, body: MessagesRequest) -> Response:
        return await messages_serving.create_message(body, http_request)

    @app.post("/v1/messages/count_tokens", dependencies=guarded,
              responses=anthropic_error_responses(400, 404, 413, *auth))
    async def count_tokens(body: CountTokensRequest) -> TokenCount:
        return await messages_serving.count_tokens(body)

    @app.post("/tokenize", dependencies=guarded,
              responses=error_responses(400, 404, 413, *auth))
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return await run_in_threadpool(tokenization.tokenize, body)  # off the event loop

    @app.post("/detokenize", dependencies=guarded,
              responses=error_responses(400, 404, 413, *auth))
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await run_in_threadpool(tokenization.detokenize, body)

    # Read-only, behind the key like the API; not part of the OpenAI-compatible document.
    app.include_router(dashboard_router(engine, guard(app, browser=True)),
                       include_in_schema=False)
    return app
