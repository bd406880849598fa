"""Anthropic's Messages API and its token count, over the chat path
(api/messages/serving.py); errors in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.messages.bodies import MessageResponse, TokenCount
from api.messages.protocol import CountTokensRequest, MessagesRequest
from api.messages.serving import MessagesServing
from api.openapi import anthropic_error_responses, anthropic_responses


def messages_router(serving: MessagesServing, guarded: Sequence[Any],
                    auth: tuple[int, ...]) -> APIRouter:
    """POST /v1/messages and /v1/messages/count_tokens; `guarded` and `auth` as
    api/openai/routes.py's."""
    router = APIRouter(dependencies=list(guarded))

    @router.post("/v1/messages", response_model=None,
                 responses=anthropic_responses(MessageResponse, *auth))
    async def messages(http_request: Request, body: MessagesRequest) -> Response:
        return await serving.create_message(body, http_request)

    @router.post("/v1/messages/count_tokens",
                 responses=anthropic_error_responses(400, 404, 413, *auth))
    async def count_tokens(body: CountTokensRequest) -> TokenCount:
        return await serving.count_tokens(body)

    return router
