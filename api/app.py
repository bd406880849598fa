"""The FastAPI app over any engine (api/engine_client.py): its middleware, error handlers,
the serving objects every surface shares, and a router per surface:

- api/server_routes.py: /health, /v1/models, /metrics;
- api/openai/routes.py: OpenAI's completions and chat completions, /tokenize, /detokenize;
- api/responses/routes.py: OpenAI's Responses API;
- api/messages/routes.py: Anthropic's Messages API (errors in Anthropic's shape);
- api/embeddings/routes.py: embeddings, rerank and score (an embedding model's);
- api/dashboard/routes.py: the dashboard, not part of the document.

What the generating endpoints share is api/serving.py's; every error leaves as the route's
envelope (api/errors.py). Who may call which route is api/security.py's; what /openapi.json
says, api/openapi.py's.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.answer import ChatFormat
from api.dashboard.routes import dashboard_router
from api.embeddings.routes import embeddings_router
from api.embeddings.serving import EmbeddingServing
from api.engine_client import EngineClient
from api.errors import APIError, describe_validation_error, error_response
from api.limits import BodySizeLimit, PromptBound, default_max_request_bytes
from api.messages.bodies import STREAM_EVENTS as MESSAGE_EVENTS
from api.messages.routes import messages_router
from api.messages.serving import MessagesServing
from api.openai.bodies import (
    ChatCompletionStreamResponse,
    CompletionStreamResponse,
)
from api.openai.chat import ChatServing
from api.openai.completions import CompletionServing
from api.openai.routes import openai_router
from api.openapi import honest_openapi
from api.responses.objects import STREAM_EVENTS as RESPONSE_EVENTS
from api.responses.routes import responses_router
from api.responses.serving import ResponsesServing
from api.security import AccessConfig, guard, install_access
from api.server_routes import server_router
from api.serving import REQUEST_ID_HEADER, Arrivals
from api.tokenization import TokenizationServing
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
               accept_unknown_fields: bool = False,
               chat_format: ChatFormat | None = None) -> FastAPI:
    """The app; structured outputs' grammars must compile within `grammar_timeout` s, a
    body over `max_request_bytes` is a 413 (None: api/limits.py's default for this engine),
    a request field no API defines is a 400 unless `accept_unknown_fields`, and the model
    thinks and calls tools as `chat_format` says (None: as its chat template shows)."""

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
    chat_format = chat_format or ChatFormat.of(engine.tokenizer)
    shared = (grammars, bound, arrivals, accept_unknown_fields, chat_format)
    completion_serving = CompletionServing(engine, model_name, *shared)
    chat_serving = ChatServing(engine, model_name, *shared)
    responses_serving = ResponsesServing(engine, model_name, *shared)
    messages_serving = MessagesServing(engine, model_name, *shared)
    tokenization = TokenizationServing(engine, completion_serving.accepted_model_names,
                                       chat_format.calls)
    guarded = guard(app)
    probe = guard(app, guarded=bool(access and access.protect_health_metrics))
    auth = (401,) if guarded else ()  # documented only where a key is asked for
    app.include_router(server_router(engine, model_name, completion_serving.check_model_name,
                                     guarded, probe))
    # The document lists what this model does: an embedding model's routes, or the
    # generating surfaces (each kind answers the other's routes with a 400 all the same).
    embeds = engine.embedding_info is not None
    app.include_router(openai_router(completion_serving, chat_serving, tokenization, guarded,
                                     auth))
    app.include_router(responses_router(responses_serving, guarded, auth),
                       include_in_schema=not embeds)
    app.include_router(messages_router(messages_serving, guarded, auth),
                       include_in_schema=not embeds)
    app.include_router(embeddings_router(EmbeddingServing(engine, model_name, arrivals,
                                                          accept_unknown_fields), guarded, auth),
                       include_in_schema=embeds)
    # Read-only, behind the key like the API; not part of the OpenAI-compatible document.
    app.include_router(dashboard_router(engine, model_name, guard(app, browser=True)),
                       include_in_schema=False)
    return app
