"""The ingress: the single server's HTTP API, forwarded to engine replicas by prompt prefix.

Every request is passed as it came (method, path, headers, body) to one replica through a
deployment handle; that replica answers it with api/app.py, so responses, errors and SSE
events are the single server's, and so are its checks of API keys and CORS (the headers
travel with the request). The ingress only pulls the prompt's text out of the body for the
router (deploy/prefix_router.py), refuses a body over --max-request-bytes (without it, over
INGRESS_MAX_BYTES) before reading it whole, with api/limits.py's 413, answers CORS as the
replicas do, and turns a replica's death into an error the client can read: HTTP 503 in
OpenAI's envelope before the response has started, an SSE error event (then `[DONE]`) in
the middle of a stream. `GET /health` and `/metrics` are answered by one replica, like any
request (its X-Nano-Vllm-Replica header says which).
"""

# No `from __future__ import annotations` here: FastAPI must see the handler's annotations as
# classes (Request), and Ray's ingress wrapper hides this module's names from it.
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from api.errors import error_body
from api.limits import BodySizeLimit
from api.security import add_cors
from deploy.asgi_call import ForwardedRequest

log = logging.getLogger("nano_vllm.deploy")
GENERATING_PATHS = ("/v1/completions", "/v1/chat/completions")
DROPPED_HEADERS = {b"content-length", b"transfer-encoding", b"connection"}
# Without --max-request-bytes, the most the ingress reads of a body before refusing it: the
# replicas' own default (what the longest prompt that fits can take, about 9 MB for the
# default model) is theirs to check; this keeps a body no model could take from being read
# whole here, key or no key.
INGRESS_MAX_BYTES = 64 << 20
# Ray Serve's proxy sets X-Request-Id on every response (the client's, if it sent one, which
# the replica's app echoes too): keep one.
DROPPED_RESPONSE_HEADERS = DROPPED_HEADERS | {b"x-request-id"}

app = FastAPI(title="nano-vLLM on Ray Serve", docs_url=None, redoc_url=None)


def routing_text(path: str, body: bytes) -> str:
    """The prompt as text, for prefix matching: the completion prompt (the first, if several;
    token ids as decimal text) or the chat messages in order. Empty if there is none."""
    if path not in GENERATING_PATHS:
        return ""
    try:
        fields = json.loads(body)
    except ValueError:
        return ""  # the replica answers with the proper 400
    if not isinstance(fields, dict):
        return ""
    if path == "/v1/completions":
        return prompt_text(fields.get("prompt"))
    messages = fields.get("messages")
    if not isinstance(messages, list):
        return ""
    return "".join(f"<{m.get('role')}>{content_text(m.get('content'))}\n"
                   for m in messages if isinstance(m, dict))


def prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return " ".join(map(str, prompt)) + " "
        return prompt_text(prompt[0])
    return ""


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def replica_lost(exc: BaseException) -> dict[str, Any]:
    log.warning("a replica failed during a request: %s", exc)
    return error_body(f"The replica serving this request failed ({type(exc).__name__}); "
                      "retry the request.", "server_error").model_dump()


@serve.ingress(app)
class Ingress:
    """The deployment's class (deploy/app.py wraps it in `serve.deployment`)."""

    def __init__(self, engines: DeploymentHandle, max_request_bytes: int | None = None,
                 allowed_origins: tuple[str, ...] = ()) -> None:
        self.engines = engines.options(method_name="forward", stream=True)
        # Before the app's first request builds its middleware stack. CORS outermost, so
        # that the ingress's own errors (413, 503) carry its headers too.
        app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes or INGRESS_MAX_BYTES)
        add_cors(app, allowed_origins)

    # HEAD for uptime probes, OPTIONS for CORS preflights: the replica's app answers both.
    @app.api_route("/{path:path}", methods=["GET", "POST", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    async def forward(self, path: str, request: Request) -> Response:
        body = await request.body()
        forwarded = ForwardedRequest(
            method=request.method, path=request.url.path, query_string=request.url.query.encode(),
            headers=[(k, v) for k, v in request.headers.raw if k.lower() not in DROPPED_HEADERS],
            body=body, routing_text=routing_text(request.url.path, body))
        messages = self.engines.remote(forwarded)
        try:
            start = await anext(messages)
        except (RayError, StopAsyncIteration) as exc:
            return JSONResponse(replica_lost(exc), status_code=503)
        status = start["status"]
        headers = {k.decode(): v.decode() for k, v in start.get("headers", [])
                   if k.lower() not in DROPPED_RESPONSE_HEADERS}
        if headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(self.stream(messages), status_code=status, headers=headers)
        try:  # not a stream: the whole body, so a failure can still be a clean 503
            content = b"".join([m.get("body", b"") async for m in messages])
        except RayError as exc:
            return JSONResponse(replica_lost(exc), status_code=503)
        return Response(content, status_code=status, headers=headers)

    async def stream(self, messages: DeploymentResponseGenerator) -> AsyncIterator[bytes]:
        finished = False
        try:
            async for message in messages:
                if message.get("body"):
                    yield message["body"]
            finished = True
        except RayError as exc:
            finished = True
            yield f"data: {json.dumps(replica_lost(exc))}\n\ndata: [DONE]\n\n".encode()
        finally:
            if not finished:  # the client left: the replica's app sees a disconnect
                messages.cancel()
