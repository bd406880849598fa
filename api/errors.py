"""Errors as OpenAI sends them: one envelope, {"error": {message, type, param, code}}; on
Anthropic's routes (/v1/messages...) as Anthropic sends them: {"type": "error", "error":
{type, message}} (api/messages/bodies.py)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import takewhile
from typing import Any, ClassVar

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.messages.bodies import anthropic_error_body
from api.openai.bodies import ErrorDetail, ErrorResponse

RETRY_AFTER_SECONDS = 1
ANTHROPIC_PATH = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    """Whether errors on `path` take Anthropic's shape (else OpenAI's envelope)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


class APIError(Exception):
    """Raised anywhere in a handler; app.py turns it into the envelope with its status."""

    headers: ClassVar[Mapping[str, str]] = {}  # sent with the envelope (set by subclasses)

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, err_type: str = "invalid_request_error",
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = (
            message, param, status, code, err_type)
        self.retry_after = retry_after  # seconds, sent as Retry-After (a 429 always has one)

    def body(self) -> ErrorResponse:
        return error_body(self.message, self.type, self.param, self.code)

    def body_for(self, path: str) -> BaseModel:
        """The body as the route at `path` speaks errors."""
        if speaks_anthropic(path):
            return anthropic_error_body(self.status, self.message, self.param, self.code)
        return self.body()


def error_body(message: str, err_type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorDetail(message=message, type=err_type, param=param,
                                           code=code))


def error_response(exc: APIError, path: str = "",
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The error as the route at `path` speaks it, with `headers` (and Retry-After)."""
    retry_after = exc.retry_after
    if retry_after is None and exc.status == 429:
        retry_after = RETRY_AFTER_SECONDS
    headers = dict(headers or {})
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return JSONResponse(exc.body_for(path).model_dump(), status_code=exc.status,
                        headers=headers or None)


def field_path(loc: tuple | list, body: Any, missing: bool = False) -> list[str]:
    """An error location as the fields of the body it points into: its parts that are no key
    or index there (the labels pydantic gives a union's members, such as 'str' or
    'list[int]', and a tagged union's tag) left out; a missing field's name kept. A query or
    path parameter's location is its name."""
    if list(loc[:1]) in (["query"], ["path"]):
        return [str(part) for part in loc[1:2]]
    parts = list(loc[1:] if loc[:1] in (("body",), ["body"]) else loc)
    path: list[str] = []
    node, tag_seen = body, False
    for k, part in enumerate(parts):
        if isinstance(node, dict) and part == node.get("type") and not tag_seen:
            tag_seen = True  # a tagged union's tag: the value of the block's "type"
        elif isinstance(node, dict) and isinstance(part, str) and part in node:
            path.append(part)
            node, tag_seen = node[part], False
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(str(part))
            node, tag_seen = node[part], False
        elif missing and k == len(parts) - 1 and isinstance(part, str):
            path.append(part)
    return path


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """A readable message and the offending field for a body pydantic refused."""
    errors = exc.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    if (first.get("type") == "model_attributes_type" and tuple(first.get("loc", ())) == ("body",)
            and isinstance(first.get("input"), str | bytes)):
        # FastAPI leaves a body unparsed unless it comes as application/json (curl -d doesn't)
        return ("The request body must be a JSON object, sent with "
                "'Content-Type: application/json'.", None)
    # A value that fits no member of a union (prompt: str | list[int] | ...) fails once per
    # member: name the field, and list every reason of the members that got furthest into
    # the value (the one the client meant: a list of blocks with one bad key, not a string).
    paths = [field_path(e.get("loc", ()), exc.body, e.get("type") == "missing") for e in errors]
    group = [i for i, path in enumerate(paths) if path[:1] == paths[0][:1]]
    deepest = max(len(paths[i]) for i in group)
    group = [i for i in group if len(paths[i]) == deepest]
    columns = zip(*(paths[i] for i in group))  # the k-th part of each path, side by side
    path = [parts[0] for parts in takewhile(lambda parts: len(set(parts)) == 1, columns)]
    reasons = list(dict.fromkeys(errors[i].get("msg", "invalid").removeprefix("Value error, ")
                                 for i in group))
    param = ".".join(path) or None
    where = f"'{param}'" if param else "the request body"
    return f"Invalid value for {where}: {'; or '.join(reasons)}.", param
