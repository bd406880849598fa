"""GET /dashboard and what the page fetches: its static files, the models it can show, an
SSE stream of engine snapshots (at most ~10 a second) and one block's details for a tooltip.
Read-only.

`?model=NAME` picks the model the page shows; on one model's server it may only name that
model (or "default"). Where a server serves several, api/model_router.py answers
/dashboard/models and the page itself, and passes the stream and the tooltips to the named
model's app without loading the model or keeping it busy (watching is not using).

With keys set, the page, its stream and its tooltips need a key (api/security.py's
browser guard): `Authorization: Bearer KEY`, or `?api_key=KEY` in the page's URL, since a
browser sends no such header when it opens a page or an EventSource; the page forwards its
own query string to the stream and tooltip requests. The static files (the page's code,
the same for everyone) are not guarded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from transformers import PreTrainedTokenizerBase

from api.dashboard.feed import FrameCache, block_details, event_data
from api.errors import APIError
from engine.snapshot import CachedBlock, EngineSnapshot

STATIC = Path(__file__).parent / "static"
MEDIA_TYPES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
FRAME_INTERVAL = 0.1  # seconds between looks at the latest snapshot: at most 10 frames/s
HEARTBEAT = 1.0  # a frame at least this often, so the charts' time axis moves when idle


class Board(Protocol):
    """Where the latest snapshot is read: engine/snapshot.py's SnapshotBoard in-process,
    engine/process/dashboard.py's ReceivedSnapshots for a core in its own process."""

    latest: EngineSnapshot | None

    def want(self) -> None:
        """Someone watches: snapshots are taken only while someone does."""
        ...


class DashboardSource(Protocol):
    """What the dashboard reads of an engine; BatchEngine (in-process) and
    EngineProcessClient (a core in its own process) both are one."""

    tokenizer: PreTrainedTokenizerBase
    snapshots: Board | None  # None: no paged KV cache to show (a baseline core, an encoder)

    @property
    def is_alive(self) -> bool:
        """False once the engine has stopped (the stream then ends)."""
        ...

    def cached_block(self, block_id: int) -> CachedBlock | None:
        """A cached-free block's content (None: not cached-free); TimeoutError if the
        engine does not answer in time."""
        ...


def dashboard_router(engine: DashboardSource, model_name: str,
                     guarded: Sequence[Any] = ()) -> APIRouter:
    """The routes over `engine`, which serves `model_name`. `guarded`: the dependencies that
    check a key (all but the static files)."""
    router = APIRouter(tags=["dashboard"])
    board = engine.snapshots
    cache = FrameCache()

    def check_model(model: str | None) -> None:
        if model not in (None, "default", model_name):
            raise APIError(f"The model '{model}' does not exist; this server serves "
                           f"'{model_name}'.", "model", status=404, code="model_not_found")

    def need_board(model: str | None = None) -> Board:
        check_model(model)
        if board is None:  # a baseline core, an encoder
            raise APIError(f"The model '{model_name}' has no paged KV cache to show.",
                           status=404, err_type="not_found_error")
        return board

    @router.get("/dashboard", response_class=HTMLResponse, dependencies=list(guarded))
    async def dashboard() -> HTMLResponse:
        return page_response()

    @router.get("/dashboard/static/{name}")
    async def static_file(name: str) -> Response:
        return static_response(name)

    @router.get("/dashboard/models", dependencies=list(guarded))
    async def models(model: str | None = None) -> JSONResponse:
        check_model(model)
        return JSONResponse(model_list([model_card(model_name, "loaded", engine)], model_name))

    @router.get("/dashboard/events", dependencies=list(guarded))
    async def events(model: str | None = None) -> EventSourceResponse:
        return EventSourceResponse(frames(engine, need_board(model), cache))

    @router.get("/dashboard/blocks/{block_id}", dependencies=list(guarded))
    async def block(block_id: int, model: str | None = None) -> JSONResponse:
        return JSONResponse(await block_view(engine, need_board(model), block_id))

    return router


def page_response() -> HTMLResponse:
    """The page: the same for every model (it reads which one from its own URL)."""
    return HTMLResponse(read_static("index.html"))


def static_response(name: str) -> Response:
    """One of the page's static files (the same for every model)."""
    if name not in MEDIA_TYPES:
        raise APIError(f"No dashboard file named {name!r}.", "name", status=404,
                       err_type="not_found_error")
    return Response(read_static(name), media_type=MEDIA_TYPES[name])


@cache
def read_static(name: str) -> str:
    return (STATIC / name).read_text()


def model_card(name: str, state: str, engine: DashboardSource | None) -> dict[str, Any]:
    """A model as the page's picker lists it; `kv_cache` is None while it is not loaded (an
    embedding model keeps none: nothing to draw)."""
    return {"id": name, "state": state,
            "kv_cache": None if engine is None else engine.snapshots is not None}


def model_list(cards: list[dict[str, Any]], current: str) -> dict[str, Any]:
    """GET /dashboard/models: every model the server serves, and the one the page shows."""
    return {"object": "list", "data": cards, "current": current}


async def frames(engine: DashboardSource, board: Board,
                 cache: FrameCache) -> AsyncIterator[dict[str, str]]:
    """The event stream: a frame for each new snapshot, and one at least every HEARTBEAT,
    until the engine stops (a model unloaded: the page then asks again)."""
    last_seq, last_sent = None, 0.0
    while engine.is_alive:
        board.want()  # snapshots are only taken while someone watches
        snapshot, now = board.latest, time.monotonic()
        if snapshot is not None and (snapshot.seq != last_seq or now - last_sent >= HEARTBEAT):
            yield {"event": "snapshot",
                   "data": event_data(cache.frame_json(snapshot), snapshot.counters)}
            last_seq, last_sent = snapshot.seq, now
        await asyncio.sleep(FRAME_INTERVAL)


async def block_view(engine: DashboardSource, board: Board, block_id: int) -> dict[str, Any]:
    """One block of the latest snapshot, with a cached-free block's content (the engine's
    to read, between steps)."""
    snapshot = board.latest
    if snapshot is None:
        raise APIError("No snapshot yet: open the event stream first.", status=503,
                       err_type="server_error")
    try:
        view = snapshot.block(block_id)
    except IndexError as exc:
        raise APIError(str(exc), "block_id", status=404, err_type="not_found_error") from exc
    cached = None
    if view.state == "cached":
        try:
            cached = await run_in_threadpool(engine.cached_block, block_id)
        except TimeoutError as exc:
            raise APIError(f"The engine did not answer: {exc}", status=503,
                           err_type="server_error") from exc
    return block_details(snapshot, view, cached, engine.tokenizer)
