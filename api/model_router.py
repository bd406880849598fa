"""Several models behind one address: each model has its own engine (an engine core process
of its own) and its own app (api/app.py's, unchanged); the router in front sends each
request to the app of the model it names, through api/model_pool.py, which loads it first if
it is not loaded.

- A generating or tokenizing request (a POST with a JSON body) goes by its `model` field;
  with none, or "default", to the first model. A name no model has is a 404 in the route's
  error shape, naming the models served; a model that cannot be loaded in time, a 503 with
  Retry-After.
- `/v1/models` lists every model, each with its `state` (loaded, loading, unloading,
  unloaded, failed); `/v1/models/{id}` answers one.
- `POST /v1/models/{id}/load` and `/unload` load or unload a model (behind the API key when
  keys are set); an unload of a model with requests in flight, or loading, is a 409.
- `/health` says each model's state; it is 200 unless the server is draining or every
  model failed.
- `/metrics` is every loaded model's metrics, each sample labelled with `model`, and
  `nano_vllm:model_loaded` for every model.
- `/dashboard` shows the model its `?model=` names (the first by default), with a picker of
  every model; watching neither loads a model nor keeps it busy (api/dashboard/routes.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from api.dashboard.routes import model_card, model_list, page_response, static_response
from api.errors import APIError, error_response
from api.model_pool import FAILED, LOADED, ModelPool
from api.model_slot import unavailable
from api.security import AccessConfig, APIKeyCheck, AuthenticationError

SERVER_ROUTES = ("/health", "/metrics", "/v1/models")
OPERATIONS = ("load", "unload")
LOADED_METRIC = ("# HELP nano_vllm:model_loaded Whether the model is loaded (1) or not (0).\n"
                 "# TYPE nano_vllm:model_loaded gauge\nnano_vllm:model_loaded {}\n")


class ModelRouter:
    """The ASGI app in front of every model's app."""

    def __init__(self, pool: ModelPool, max_request_bytes: int,
                 access: AccessConfig | None = None) -> None:
        self.pool = pool
        self.max_request_bytes = max_request_bytes  # beyond it, the model's app answers 413
        access = access or AccessConfig()
        self.keys = APIKeyCheck(access.api_keys)
        self.protect_probes = access.protect_health_metrics
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            await self.through(self.pool.default, scope, receive, send)
            return
        path = scope["path"]
        try:
            if path in SERVER_ROUTES:
                await self.server_route(scope, receive, send)
            elif path == "/dashboard" or path.startswith("/dashboard/"):
                await self.dashboard(path, scope, receive, send)
            elif path.startswith("/v1/models/"):
                await self.model_route(path.removeprefix("/v1/models/"), scope, receive, send)
            elif scope["method"] == "POST":
                await self.by_body(scope, receive, send)
            else:
                await self.through(self.pool.default, scope, receive, send)
        except APIError as exc:
            await error_response(exc, path, exc.headers)(scope, receive, send)

    def pick(self, name: str | None) -> str:
        """The model a request names; APIError 404 for a name no model has."""
        if name in (None, "", "default"):
            return self.pool.default
        if name not in self.pool.slots:
            raise APIError(f"The model '{name}' does not exist; this server serves "
                           f"{', '.join(repr(n) for n in self.pool.slots)}.", "model", status=404,
                           code="model_not_found")
        return name

    async def through(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        """The request to the model's app, once the model is loaded (APIError if it is not
        in time); the model counts as busy until the app has answered."""
        model = await self.pool.acquire(name)
        try:
            await model.app(scope, receive, send)
        finally:
            self.pool.release(model)

    def check_key(self, scope: Scope, probe: bool = False, browser: bool = False) -> None:
        """api/security.py's check where the router answers itself: AuthenticationError
        without a valid key, when keys are set (on /health and /metrics only with
        --protect-health-metrics; `browser`: an `api_key` query parameter will do)."""
        if not self.keys.enabled or (probe and not self.protect_probes):
            return
        if browser and any(self.keys.allows_key(key) for key in
                           query(scope).get("api_key", [])):
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        authorization, api_key = headers.get("authorization"), headers.get("x-api-key")
        if (authorization is not None and self.keys.allows(authorization)) or (
                api_key is not None and self.keys.allows_key(api_key)):
            return
        if authorization is None and api_key is None:
            raise AuthenticationError("No API key provided: send 'Authorization: Bearer KEY' "
                                      "or 'x-api-key: KEY'.")
        raise AuthenticationError("Incorrect API key provided.")

    async def model_route(self, rest: str, scope: Scope, receive: Receive, send: Send) -> None:
        """/v1/models/{id}, and an operator's POST /v1/models/{id}/load or /unload."""
        name, _, operation = rest.rpartition("/")
        if scope["method"] == "POST" and operation in OPERATIONS and name:
            self.check_key(scope)
            name = self.pick(name)
            state = await (self.pool.load(name) if operation == "load"
                           else self.pool.unload(name))
            await JSONResponse({"id": name, "object": "model", "state": state})(
                scope, receive, send)
            return
        name = self.pick(rest)
        slot = self.pool.slots[name]
        if slot.state != LOADED or slot.model is None:
            self.check_key(scope)
            await JSONResponse(self.card(name))(scope, receive, send)
            return
        status, headers, body = await call(slot.model.app, scope)
        if status == 200 and scope["method"] == "GET":
            body = json.dumps({**json.loads(body), "state": self.pool.state(name)}).encode()
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
        await send_whole(status, headers, body, send)

    async def dashboard(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        """The page and its files (the same for every model) and the list of models are
        answered here; the snapshot stream and the tooltips by the named model's app, only
        while it is loaded: watching neither loads a model nor counts as using it."""
        if path.startswith("/dashboard/static/"):
            await static_response(path.removeprefix("/dashboard/static/"))(scope, receive, send)
            return
        self.check_key(scope, browser=True)
        name = self.pick(query(scope).get("model", [None])[0])
        slot = self.pool.slots[name]
        if path == "/dashboard":
            await page_response()(scope, receive, send)
        elif path == "/dashboard/models":
            cards = [model_card(n, self.pool.state(n), s.model.engine if s.model else None)
                     for n, s in self.pool.slots.items()]
            await JSONResponse(model_list(cards, name))(scope, receive, send)
        elif slot.state == LOADED and slot.model is not None:
            await slot.model.app(scope, receive, send)
        else:
            raise unavailable(f"The model '{name}' is {self.pool.state(name)}: its dashboard "
                              "shows once it is loaded (by a request to it, or POST "
                              f"/v1/models/{name}/load); watching does not load it.",
                              retry_after=5)

    def card(self, name: str) -> dict[str, Any]:
        """A model's object while it is not loaded (what its engine would add is unknown)."""
        return {"id": name, "object": "model", "created": self.created, "owned_by": "nano-vllm",
                "type": "model", "display_name": name,
                "created_at": datetime.fromtimestamp(self.created, UTC).isoformat(),
                "state": self.pool.state(name)}

    async def by_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body (up to the size limit), pick the app by its `model`, and hand the
        body over. A body over the limit, or not JSON, goes to the first model's app, which
        answers it as it answers every such body."""
        chunks, size, more = [], 0, True
        while more and size <= self.max_request_bytes:
            message = await receive()
            if message["type"] != "http.request":
                await self.through(self.pool.default, scope, replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        self.check_key(scope)  # before a model is loaded for it: every POST route asks one
        target = self.pool.default
        if not more:
            try:
                name = json.loads(body).get("model") if body else None
                target = self.pick(name if isinstance(name, str) else None)
            except (ValueError, AttributeError):
                pass  # not a JSON object: the app says so
        await self.through(target, scope, replay([{"type": "http.request", "body": body,
                                                    "more_body": more}], receive), send)

    async def server_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        self.check_key(scope, probe=path != "/v1/models")
        answers = {m.name: await call(m.app, scope) for m in self.pool.loaded()}
        if path == "/v1/models":
            await self.model_list(answers, scope, receive, send)
        elif path == "/health":
            states = {name: self.pool.state(name) for name in self.pool.slots}
            errors = {name: slot.error for name, slot in self.pool.slots.items()
                      if states[name] == FAILED and slot.error}
            closing = self.pool.closing
            serving = closing is None and any(s != FAILED for s in states.values())
            body: dict[str, Any] = {"status": "ok" if serving else "unavailable",
                                    "models": states}
            if errors:
                body["errors"] = errors
            if closing is not None:
                body["reason"] = closing
            await JSONResponse(body, status_code=200 if serving else 503)(scope, receive, send)
        else:
            texts = {name: answers[name][2] if name in answers else b""
                     for name in self.pool.slots}
            for name in texts:
                loaded = int(self.pool.state(name) == LOADED)
                texts[name] += LOADED_METRIC.format(loaded).encode()
            await send_plain(merge_metrics(texts), scope, receive, send)

    async def model_list(self, answers: dict[str, tuple[int, list, bytes]], scope: Scope,
                         receive: Receive, send: Send) -> None:
        refused = [answer for answer in answers.values() if answer[0] != 200]
        if refused:  # a bad query: the first app's answer
            await send_whole(*refused[0], send)
            return
        paging = b"after_id=" in scope.get("query_string", b"") or (
            b"before_id=" in scope.get("query_string", b""))
        data = []
        for name in self.pool.slots:
            if name in answers:
                data += [{**card, "state": self.pool.state(name)}
                         for card in json.loads(answers[name][2])["data"]]
            elif not paging:  # (a page after or before the one model is empty)
                data.append(self.card(name))
        listing = {"object": "list", "data": data, "has_more": False,
                   "first_id": data[0]["id"] if data else None,
                   "last_id": data[-1]["id"] if data else None}
        await JSONResponse(listing)(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """Every loaded model's app's own start-up and shut-down, around the server's."""
        message = await receive()
        assert message["type"] == "lifespan.startup"
        await self.pool.open()
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        await self.pool.close()
        await send({"type": "lifespan.shutdown.complete"})


def query(scope: Scope) -> dict[str, list[str]]:
    """A request's query parameters."""
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


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
