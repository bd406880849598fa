"""The OpenAPI document at /openapi.json, made to say what the server does.

FastAPI's own document promises a 422 with its `detail` list for a body it cannot validate;
we answer 400 in OpenAI's envelope (api/errors.py). The routes declare what they answer
with the helpers here (`error_responses`, `generation_responses`, `text_response`), and
`honest_openapi` drops the 422s FastAPI adds on its own. Streams are documented as
text/event-stream whose events carry the chunk model or an error envelope (OpenAPI 3.2's
`itemSchema`, which schemathesis checks each event against). Anthropic's routes
(/v1/messages...) are documented in Anthropic's shapes: its error body and its named events
(`anthropic_responses`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from api.messages.bodies import STREAM_EVENTS, AnthropicErrorResponse
from api.openai.bodies import ErrorResponse
from api.protocol import TOKEN_ID_MARKER

ERROR_DESCRIPTIONS = {
    400: "Invalid request: OpenAI's error envelope, naming the field (`param`).",
    401: "No API key, or a wrong one (the server was started with --api-key).",
    404: "Not found.",
    405: "Method not allowed; the `Allow` header lists the ones that are.",
    413: "The request body is larger than the server takes (--max-request-bytes).",
    429: "The waiting line is full; retry after `Retry-After` seconds.",
    500: "The engine failed this request.",
    503: "The server cannot take requests (its engine has stopped, or it is shutting down).",
    504: "The request's deadline (--request-timeout or its `request_timeout`) passed before "
         "its answer was complete.",
}
HEADER_DESCRIPTIONS = {
    401: {"WWW-Authenticate": "Bearer"},
    405: {"Allow": "The methods this path accepts."},
    429: {"Retry-After": "Seconds to wait before retrying."},
}
SSE_DESCRIPTION = ("with `stream: true`: Server-Sent Events, one `data:` line per event, each "
                   "a JSON chunk ({chunk}); then `data: [DONE]`. An error after the stream "
                   "has begun comes as one event holding OpenAI's error envelope (code "
                   "`request_timeout` when the deadline passed).")


ANTHROPIC_SSE_DESCRIPTION = (
    "with `stream: true`: Server-Sent Events as Anthropic sends them, each an `event:` line "
    "naming its type and a `data:` line with the event as JSON: message_start; for each "
    "content block content_block_start, content_block_delta (text_delta or input_json_delta) "
    "and content_block_stop; then message_delta and message_stop. An error after the stream "
    "has begun comes as an `error` event in Anthropic's error shape.")
ANTHROPIC_400 = ("Invalid request: Anthropic's error shape {type: error, error: {type, "
                 "message}}, the message beginning with the field at fault.")


def error_responses(*statuses: int, model: type[BaseModel] = ErrorResponse
                    ) -> dict[int | str, dict[str, Any]]:
    """The error statuses a route can answer with, each as `model` (OpenAI's envelope)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"model": model, "description": ERROR_DESCRIPTIONS[status]}
        if status in HEADER_DESCRIPTIONS:
            out[status]["headers"] = {
                name: {"description": text, "schema": {"type": "string"}}
                for name, text in HEADER_DESCRIPTIONS[status].items()}
    return out


def generation_responses(response: type[BaseModel], chunk: type[BaseModel],
                         *statuses: int) -> dict[int | str, dict[str, Any]]:
    """A generating route: one JSON body, or an SSE stream of chunks; and its errors (those
    every generating route has, and `statuses`)."""
    stream = {"itemSchema": sse_event(chunk)}
    return {200: {"model": response,
                  "description": "The answer as one JSON body; or, " + SSE_DESCRIPTION.format(
                      chunk=chunk.__name__),
                  "content": {"text/event-stream": stream}},
            **error_responses(400, 404, 413, 429, 500, 503, 504, *statuses)}


def json_of(model: type[BaseModel]) -> dict[str, Any]:
    """A string holding a JSON `model`."""
    return {"type": "string", "contentMediaType": "application/json",
            "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"}}


def sse_event(chunk: type[BaseModel]) -> dict[str, Any]:
    """One event of a stream (OpenAPI 3.2's way): its data is a JSON chunk, an error
    envelope, or the closing [DONE]."""
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_text(chunk),
                                              json_text(ErrorResponse)]}}}


def anthropic_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error statuses an Anthropic route can answer with, each in Anthropic's shape."""
    out = error_responses(*statuses, model=AnthropicErrorResponse)
    if 400 in out:
        out[400]["description"] = ANTHROPIC_400
    return out


def anthropic_responses(response: type[BaseModel],
                        *statuses: int) -> dict[int | str, dict[str, Any]]:
    """/v1/messages: one message as JSON, or Anthropic's named events; and its errors."""
    def named(name: str, model: type[BaseModel]) -> dict[str, Any]:
        return {"properties": {"event": {"const": name}, "data": json_text(model)}}

    events = [named(m.model_fields["type"].default, m) for m in STREAM_EVENTS]
    item = {"type": "object", "required": ["event", "data"],
            "anyOf": [*events, named("error", AnthropicErrorResponse)]}
    return {200: {"model": response,
                  "description": "The message as one JSON body; or, " + ANTHROPIC_SSE_DESCRIPTION,
                  "content": {"text/event-stream": {"itemSchema": item}}},
            **anthropic_error_responses(400, 404, 413, 429, 500, 503, 504, *statuses)}


def json_text(model: type[BaseModel]) -> dict[str, Any]:
    """A string holding `model` as JSON (an event's data)."""
    return {"type": "string", "contentMediaType": "application/json",
            "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"}}


def named_event_responses(response: type[BaseModel], events: list[type[BaseModel]],
                          *statuses: int) -> dict[int | str, dict[str, Any]]:
    """A generating route whose stream names each event (the Responses API's): `event:` is
    its type, `data:` one of `events` as JSON; no [DONE] closes it."""
    item = {"type": "object", "required": ["event", "data"],
            "properties": {"event": {"type": "string"},
                           "data": {"anyOf": [json_of(event) for event in events]}}}
    return {200: {"model": response,
                  "description": "The answer as one JSON body; or, with `stream: true`: "
                                 "Server-Sent Events, each named by its `type` (`event:`) and "
                                 "carrying it as JSON (`data:`), numbered by `sequence_number`"
                                 ", ending with response.completed or response.incomplete. An "
                                 "error after the stream has begun comes as an `error` event.",
                  "content": {"text/event-stream": {"itemSchema": item}}},
            **error_responses(400, 404, 413, 429, 500, 503, 504, *statuses)}


def text_response(description: str) -> dict[int | str, dict[str, Any]]:
    """A route that answers plain text (/metrics: Prometheus' text format)."""
    return {200: {"description": description,
                  "content": {"text/plain": {"schema": {"type": "string"}}}}}


def bound_token_ids(node: Any, vocab_size: int) -> None:
    """Every token id in the document (marked by api/protocol.py's TokenId) gets the model's
    vocabulary as its maximum."""
    if isinstance(node, list):
        for item in node:
            bound_token_ids(item, vocab_size)
    elif isinstance(node, dict):
        if node.pop(TOKEN_ID_MARKER, False):
            node["maximum"] = vocab_size - 1
        for value in node.values():
            bound_token_ids(value, vocab_size)


def name_served_models(schemas: dict[str, Any], model_names: list[str]) -> None:
    """A request's `model` may only name a served model (another name is a 404): say so."""
    for schema in schemas.values():
        field = schema.get("properties", {}).get("model")
        if field is None:
            continue
        branches = field.get("anyOf", [field])
        for branch in branches:
            if branch.get("type") == "string":
                branch["enum"] = sorted(model_names)


def honest_openapi(app: FastAPI, extra_models: list[type[BaseModel]],
                   vocab_size: int, model_names: list[str] | None = None) -> dict[str, Any]:
    """FastAPI's document without the 422s it adds, with `extra_models` (the stream chunks,
    which no route returns as JSON) among its schemas, token ids bounded by the model's
    `vocab_size`, and `model` limited to `model_names`. Built once, then cached."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    # 3.2: the first version whose media types have itemSchema, which the event streams use.
    doc = get_openapi(title=app.title, version=app.version, openapi_version="3.2.0",
                      routes=app.routes, description=app.description)
    for path in doc.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for model in extra_models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}",
                                         mode="serialization")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    bound_token_ids(doc, vocab_size)
    if model_names:
        name_served_models(schemas, model_names)
    app.openapi_schema = doc
    return doc
