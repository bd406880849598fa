"""OpenAI's Responses API: the route, over api/responses/serving.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.openapi import named_event_responses
from api.responses.objects import STREAM_EVENTS, ResponseObject
from api.responses.protocol import ResponsesRequest
from api.responses.serving import ResponsesServing


def responses_router(serving: ResponsesServing, guarded: Sequence[Any],
                     auth: tuple[int, ...]) -> APIRouter:
    """POST /v1/responses; `guarded` and `auth` as api/openai/routes.py's."""
    router = APIRouter(dependencies=list(guarded))

    @router.post("/v1/responses", response_model=None,
                 responses=named_event_responses(ResponseObject, STREAM_EVENTS, *auth))
    async def responses(http_request: Request, body: ResponsesRequest) -> Response:
        return await serving.create_response(body, http_request)

    return router
