"""The FastAPI app: routes and error handlers over any engine (api/engine_client.py).

The generating endpoints are api/serving.py's; request bodies are api/protocol.py's,
response bodies api/responses.py's, and every error leaves as OpenAI's envelope
(api/errors.py).
"""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.engine_client import EngineClient
from api.errors import APIError, describe_validation_error, error_body, error_response
from api.protocol import ChatCompletionRequest, CompletionRequest
from api.responses import DetokenizeResponse, ModelCard, ModelList, TokenizeResponse
from api.serving import REQUEST_ID_HEADER
from api.serving_chat import ChatServing
from api.serving_completion import CompletionServing
from api.tokenization import DetokenizeRequest, TokenizationServing, TokenizeRequest
from engine.structured.compiler import DEFAULT_COMPILE_TIMEOUT_S, GrammarCompiler

log = logging.getLogger("nano_vllm.api")


async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
    response = error_response(exc)
    if REQUEST_ID_HEADER in request.headers:  # echoed back, as on a success
        response.headers[REQUEST_ID_HEADER] = request.headers[REQUEST_ID_HEADER]
    return response


async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = describe_validation_error(exc)
    return error_response(APIError(message, param))


async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    err_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), err_type).model_dump(),
                        status_code=exc.status_code)


async def on_unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error in a request handler")
    return JSONResponse(error_body(f"Internal server error: {exc}", "server_error").model_dump(),
                        status_code=500)


def create_app(engine: EngineClient, model_name: str,
               grammar_timeout: float = DEFAULT_COMPILE_TIMEOUT_S) -> FastAPI:
    """The app; structured outputs' grammars compile within `grammar_timeout` seconds."""
    app = FastAPI(title="nano-vLLM", docs_url=None, redoc_url=None)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected_error)
    grammars = GrammarCompiler(engine.tokenizer, grammar_timeout)  # one cache for both
    completion_serving = CompletionServing(engine, model_name, grammars)
    chat_serving = ChatServing(engine, model_name, grammars)
    tokenization = TokenizationServing(engine, completion_serving.accepted_model_names)
    created = int(time.time())

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.is_alive:
            body = error_body("The engine thread has stopped.", "server_error")
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=created,
                                         max_model_len=engine.max_tokens_per_request)])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(http_request: Request, body: CompletionRequest) -> Response:
        return await completion_serving.create(body, http_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(http_request: Request, body: ChatCompletionRequest) -> Response:
        return await chat_serving.create(body, http_request)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return tokenization.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return tokenization.detokenize(body)

    return app
