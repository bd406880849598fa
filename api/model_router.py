"""Several models behind one address: each model has its own engine (an engine core process
of its own) and its own app (api/app.py's, unchanged); the router in front sends each
request to the app of the model it names.

- A generating or tokenizing request (a POST with a JSON body) goes by its `model` field;
  with none, or "default", to the first model. A name no model has is a 404 in the route's
  error shape, naming the models served.
- `/v1/models` lists every model; `/v1/models/{id}` answers from that model's app.
- `/health` says each model's state; it is 200 while at least one model serves.
- `/metrics` is every model's metrics, each sample labelled with `model`.
- The dashboard shows the first model.

A model whose engine dies fails only its own requests; the others keep serving, and its
requests get 503 until the server is restarted (no restart policy). A drain (SIGTERM) drains
every model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from api.engine_client import ServedEngine
from api.errors import APIError, error_response

log = logging.getLogger("nano_vllm.api")

SERVER_ROUTES = ("/health", "/metrics", "/v1/models")


@dataclass
class ServedModel:
    name: str
    engine: ServedEngine
    app: FastAPI


class ModelRouter:
    """The ASGI app in front of every model's app."""

    def __init__(self, models: list[ServedModel], max_request_bytes: int) -> None:
        self.models = {m.name: m for m in models}
        self.default = models[0]
        self.max_request_bytes = max_request_bytes  # beyond it, the model's app answers 413

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            await self.default.app(scope, receive, send)
            return
        path = scope["path"]
        if path in SERVER_ROUTES:
            await self.server_route(scope, receive, send)
        elif path.startswith("/v1/models/"):
            try:
                model = self.pick(path.removeprefix("/v1/models/"))
            except APIError as exc:
                await error_response(exc, path)(scope, receive, send)
                return
            await model.app(scope, receive, send)
        elif scope["method"] == "POST":
            await self.by_body(scope, receive, send)
        else:
            await self.default.app(scope, receive, send)

    def pick(self, name: str | None) -> ServedModel:
        """The model a request names; APIError 404 for a name no model has."""
        if name in (None, "", "default"):
            return self.default
        found = self.models.get(name)
        if found is None:
            raise APIError(f"The model '{name}' does not exist; this server serves "
                           f"{', '.join(repr(n) for n in self.models)}.", "model", status=404,
                           code="model_not_found")
        return found

    async def by_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body (up to the size limit), pick the app by its `model`, and hand the
        body over. A body over the limit, or not JSON, goes to the first model's app, which
        answers it as it answers every such body."""
        chunks, size, more = [], 0, True
        while more and size <= self.max_request_bytes:
            message = await receive()
            if message["type"] != "http.request":
                await self.default.app(scope, replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        target = self.default
        if not more:
            try:
                name = json.loads(body).get("model") if body else None
                target = self.pick(name if isinstance(name, str) else None)
            except APIError as exc:
                await error_response(exc, scope["path"])(scope, receive, send)
                return
            except (ValueError, AttributeError):
                pass  # not a JSON object: the app says so
        await target.app(scope, replay([{"type": "http.request", "body": body,
                                          "more_body": more}], receive), send)

    async def server_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        answers = {name: await call(m.app, scope) for name, m in self.models.items()}
        refused = answers[self.default.name]
        if refused[0] == 401:  # a key is asked for here, and the request has none
            await send_whole(*refused, send)
            return
        if path == "/v1/models":
            await self.model_list(answers, scope, receive, send)
        elif path == "/health":
            states = {name: "ok" if status == 200 else json.loads(body)["error"]["message"]
                      for name, (status, _, body) in answers.items()}
            serving = any(state == "ok" for state in states.values())
            await JSONResponse({"status": "ok" if serving else "unavailable", "models": states},
                               status_code=200 if serving else 503)(scope, receive, send)
        else:
            texts = {name: body for name, (_, _, body) in answers.items()}
            await send_plain(merge_metrics(texts), scope, receive, send)

    async def model_list(self, answers: dict[str, tuple[int, list, bytes]], scope: Scope,
                         receive: Receive, send: Send) -> None:
        status, headers, first = answers[self.default.name]
        if status != 200:  # a refused key or a bad query: the first app's answer
            await send_whole(status, headers, first, send)
            return
        data = [card for _, (_, _, body) in answers.items()
                for card in json.loads(body)["data"]]
        listing = {**json.loads(first), "data": data,
                   "first_id": data[0]["id"] if data else None,
                   "last_id": data[-1]["id"] if data else None}
        await JSONResponse(listing)(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """Every model's app's own start-up and shut-down, around the server's."""
        async with AsyncExitStack() as stack:
            message = await receive()
            assert message["type"] == "lifespan.startup"
            for model in self.models.values():
                await stack.enter_async_context(model.app.router.lifespan_context(model.app))
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives `messages` first, then the connection's own."""
    pending = list(messages)

    async def receive_again() -> Message:
        return pending.pop(0) if pending else await receive()

    return receive_again


async def call(app: Callable, scope: Scope) -> tuple[int, list, bytes]:
    """An app's whole answer to a bodiless request (status, headers, body)."""
    sent: dict[str, Any] = {"body": b""}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent["status"], sent["headers"] = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            sent["body"] += message.get("body", b"")

    await app(dict(scope), receive, send)
    return sent["status"], sent["headers"], sent["body"]


async def send_whole(status: int, headers: list, body: bytes, send: Send) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_plain(text: bytes, scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"text/plain; version=0.0.4")]
    await send_whole(200, headers, text, send)


def merge_metrics(texts: dict[str, bytes]) -> bytes:
    """Prometheus text from each model's, one family at a time (its HELP and TYPE once, then
    every model's samples), each sample labelled model="NAME"."""
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for name, text in texts.items():
        family = ""
        for line in text.decode().splitlines():
            if line.startswith("# "):
                family = line.split()[2]
                if line not in heads.setdefault(family, []):
                    heads[family].append(line)
            elif line.strip():
                samples.setdefault(family, []).append(labelled(line, name))
    families: Iterable[str] = dict.fromkeys([*heads, *samples])
    lines = [line for f in families for line in (*heads.get(f, []), *samples.get(f, []))]
    return ("\n".join(lines) + "\n").encode()


def labelled(sample: str, model: str) -> str:
    """A sample line with model="..." first among its labels."""
    label = f'model={json.dumps(model)}'
    metric, _, rest = sample.partition(" ")
    if "{" in metric:
        name, _, labels = metric.partition("{")
        return f"{name}{{{label},{labels} {rest}" if labels != "}" else f"{name}{{{label}}} {rest}"
    return f"{metric}{{{label}}} {rest}"


class EngineGroup:
    """Every model's engine as the server's lifecycle sees one (api/lifecycle.py): started,
    drained and stopped together. A failure of one is that model's alone: it is logged, and
    the server keeps serving the others (the failure callback is never called)."""

    def __init__(self, models: list[ServedModel]) -> None:
        self.models = models
        for model in models:
            model.engine.on_failure(lambda name=model.name: log.error(
                "the engine of %s failed: its requests get 503; the other models serve on",
                name))

    @property
    def num_in_flight(self) -> int:
        return sum(m.engine.num_in_flight for m in self.models)

    def start(self) -> None:
        for model in self.models:
            model.engine.start()

    def shutdown(self) -> None:
        for model in self.models:
            model.engine.shutdown()

    def stop_accepting(self, reason: str) -> None:
        for model in self.models:
            model.engine.stop_accepting(reason)

    def abort_all(self, error: str) -> None:
        for model in self.models:
            model.engine.abort_all(error)

    def on_failure(self, callback: Callable[[], None]) -> None:
        """The server does not exit for one model's failure."""

    def stats(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for model in self.models:
            for key, value in model.engine.stats().items():
                totals[key] = totals.get(key, 0) + value
        return totals
