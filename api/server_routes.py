"""The routes about the server rather than a model's output: /health, /v1/models (and one
model by id), /metrics; each answers HEAD too, as uptime monitors send it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, RedirectResponse, Response

from api.engine_client import EngineClient
from api.errors import error_body
from api.openai.bodies import HealthStatus, ModelCard, ModelList
from api.openapi import error_responses, text_response


def server_router(engine: EngineClient, model_name: str,
                  check_model_name: Callable[[str], None], guarded: Sequence[Any],
                  probe: Sequence[Any]) -> APIRouter:
    """`check_model_name` raises the 404 for a name this server does not serve; `guarded`:
    the key check's dependencies for the model routes, `probe`: those for /health and
    /metrics (a key only with --protect-health-metrics)."""
    router = APIRouter()
    auth = (401,) if guarded else ()  # documented only where a key is asked for
    probe_auth = (401,) if probe else ()
    created = int(time.time())
    card = ModelCard(id=model_name, created=created, display_name=model_name,
                     created_at=datetime.fromtimestamp(created, UTC).isoformat(),
                     max_model_len=engine.max_tokens_per_request, model_type=engine.model_type,
                     max_position_embeddings=engine.max_position_embeddings)

    async def health() -> JSONResponse:
        reason = engine.unavailable_reason  # shutting down, or the engine thread died
        if reason is not None:
            body = error_body(reason, "server_error", code="service_unavailable")
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(after_id: str | None = None, before_id: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> ModelList:
        """The one model; Anthropic's page parameters: a page after or before it is empty
        (so a client paging by hand stops), `limit` (1 to 1000) changes nothing."""
        if after_id is not None or before_id is not None:
            return ModelList(data=[])
        return ModelList(data=[card], first_id=card.id, last_id=card.id)

    async def model(model_id: str) -> ModelCard:
        """The served model, by its name or "default"."""
        if not model_id:  # "/v1/models/": the list, as before this route took the path
            return RedirectResponse("/v1/models")
        check_model_name(model_id)
        return card

    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    router.add_api_route("/health", health, dependencies=list(probe),
                         response_model=HealthStatus,
                         responses=error_responses(503, *probe_auth))
    router.add_api_route("/v1/models", models, dependencies=list(guarded),
                         responses=error_responses(400, *auth))
    router.add_api_route("/v1/models/{model_id:path}", model, dependencies=list(guarded),
                         responses=error_responses(404, *auth))
    router.add_api_route("/metrics", metrics, dependencies=list(probe), response_class=Response,
                         responses={**text_response("Prometheus' text exposition format, "
                                                    "version 0.0.4."),
                                    **error_responses(*probe_auth)})
    for path, endpoint, dependencies in (("/health", health, probe),
                                          ("/v1/models", models, guarded),
                                          ("/v1/models/{model_id:path}", model, guarded),
                                          ("/metrics", metrics, probe)):
        router.add_api_route(path, endpoint, methods=["HEAD"], dependencies=list(dependencies),
                             include_in_schema=False)
    return router
