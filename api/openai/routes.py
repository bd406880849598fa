"""OpenAI's completions and chat completions, and vLLM's /tokenize and /detokenize beside
them: the routes, over their serving objects (api/openai/completions.py, chat.py,
api/tokenization.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.openai.bodies import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    CompletionResponse,
    CompletionStreamResponse,
    DetokenizeResponse,
    TokenizeResponse,
)
from api.openai.chat import ChatServing
from api.openai.completions import CompletionServing
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openapi import error_responses, generation_responses
from api.tokenization import DetokenizeRequest, TokenizationServing, TokenizeRequest


def openai_router(completion_serving: CompletionServing, chat_serving: ChatServing,
                  tokenization: TokenizationServing, guarded: Sequence[Any],
                  auth: tuple[int, ...]) -> APIRouter:
    """The routes; `guarded`: the key check's dependencies, `auth`: (401,) where a key is
    asked for (documented only there)."""
    router = APIRouter(dependencies=list(guarded))

    @router.post("/v1/completions", response_model=None,
                 responses=generation_responses(CompletionResponse, CompletionStreamResponse,
                                                *auth))
    async def completions(http_request: Request, body: CompletionRequest) -> Response:
        return await completion_serving.create(body, http_request)

    @router.post("/v1/chat/completions", response_model=None,
                 responses=generation_responses(ChatCompletionResponse,
                                                ChatCompletionStreamResponse, *auth))
    async def chat_completions(http_request: Request, body: ChatCompletionRequest) -> Response:
        return await chat_serving.create(body, http_request)

    @router.post("/tokenize", responses=error_responses(400, 404, 413, *auth))
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return await run_in_threadpool(tokenization.tokenize, body)  # off the event loop

    @router.post("/detokenize", responses=error_responses(400, 404, 413, *auth))
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return await run_in_threadpool(tokenization.detokenize, body)

    return router
