"""The embedding routes: /v1/embeddings, /v1/rerank (and /rerank, as vLLM and llama.cpp
serve it too) and /v1/score, over api/embeddings/serving.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.embeddings.protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from api.embeddings.serving import EmbeddingServing
from api.openapi import error_responses

ERRORS = (400, 404, 413, 429, 500, 503, 504)


def embeddings_router(serving: EmbeddingServing, guarded: Sequence[Any],
                      auth: tuple[int, ...]) -> APIRouter:
    router = APIRouter(dependencies=list(guarded))

    def answers(model: type) -> dict[int | str, dict[str, Any]]:
        return {200: {"model": model}, **error_responses(*ERRORS, *auth)}

    @router.post("/v1/embeddings", response_model=None, responses=answers(EmbeddingResponse))
    async def embeddings(http_request: Request, body: EmbeddingRequest) -> Response:
        return await serving.embeddings(body, http_request)

    @router.post("/v1/rerank", response_model=None, responses=answers(RerankResponse))
    async def rerank(http_request: Request, body: RerankRequest) -> Response:
        return await serving.rerank(body, http_request)

    @router.post("/rerank", response_model=None, responses=answers(RerankResponse),
                 include_in_schema=False)
    async def rerank_unversioned(http_request: Request, body: RerankRequest) -> Response:
        return await serving.rerank(body, http_request)

    @router.post("/v1/score", response_model=None, responses=answers(ScoreResponse))
    async def score(http_request: Request, body: ScoreRequest) -> Response:
        return await serving.score(body, http_request)

    return router
