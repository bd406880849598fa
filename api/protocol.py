"""What every request body shares: strict types for the fields we read, text that must be
Unicode, null as each field's default, and the rules between fields that the OpenAPI
document states (SCHEMA_RULES). A generating body says what it asks for that this server
does not do (`check_supported`, from api/field_policy.py's table of every field each
endpoint may be sent); its sampling fields are api/sampling.py's, each surface's bodies
in its own folder. Refusals raise APIError, which becomes a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from api.errors import APIError
from api.field_policy import check_fields

# The shortest deadline a request may ask for. Below a millisecond no engine step (on any
# device this server runs on) completes, so such a deadline could only ever end in a 504:
# it is refused as a mistake instead (5e-324 is a float, not a deadline).
MIN_REQUEST_TIMEOUT = 0.001

NonEmptyText = Annotated[str, Field(min_length=1)]

# A token id. Its upper bound is the model's vocabulary: /openapi.json states it where this
# marker stands (api/openapi.py).
TOKEN_ID_MARKER = "x-token-id"


def integral_float_as_int(value: object) -> object:
    """JSON has one kind of number, and JSON Schema's "integer" takes 7.0: so do we, for
    token ids (7.5 still fails as not an integer)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def or_null(json_type: str, default: object) -> tuple[BeforeValidator, WithJsonSchema]:
    """A field whose null means its default (the OpenAI client sends null for a None it is
    given, and OpenAI's API and vLLM read it so), documented as taking null."""
    return (BeforeValidator(lambda value: default if value is None else value),
            WithJsonSchema({"anyOf": [{"type": json_type}, {"type": "null"}]}))


NullFalse = Annotated[bool, *or_null("boolean", False)]


TokenId = Annotated[int, Field(ge=0, json_schema_extra={TOKEN_ID_MARKER: True}),
                    BeforeValidator(integral_float_as_int)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class APIModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


def broken_text_at(value: Any) -> str | None:
    """Where in a parsed JSON body a string (a value or a key) holds a lone UTF-16 surrogate
    (JSON lets "\\ud800" through, and no text can be encoded from it), or None. One pass of
    the C encoder answers for a whole body; only a body that fails it is walked (by hand, so
    that no nesting is too deep), to name the place."""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
        return None
    except UnicodeEncodeError:
        pass
    except (RecursionError, ValueError):
        return None  # too deep or circular for the encoder: the validation says what is wrong
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str) and not is_unicode(node):
            return render_path(path)
        if isinstance(node, dict):
            for key, item in node.items():
                if not is_unicode(str(key)):
                    return render_path(path) + " (a key)" if path else "a key of the body"
                stack.append((item, (*path, key)))
        elif isinstance(node, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(node))
    return None


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def render_path(path: tuple[str | int, ...]) -> str:
    """messages[0].content: keys joined by dots (each cut to 40 characters), indexes in []."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part[:40]}"
    return out or "the body"


def not_both(a: str, b: str) -> dict[str, Any]:
    """A JSON Schema rule: fields `a` and `b` are not both given (null counts as absent)."""
    given = {"not": {"type": "null"}}
    return {"not": {"properties": {a: given, b: given}, "required": [a, b]}}


def needs(field: str, other: str, value: Any) -> dict[str, Any]:
    """A JSON Schema rule: `field`, when given (not null), needs `other` to be `value`."""
    return {"if": {"properties": {field: {"not": {"type": "null"}}}, "required": [field]},
            "then": {"properties": {other: {"const": value}}, "required": [other]}}


def add_schema_rules(schema: dict[str, Any], cls: type) -> None:
    """The document's body schema gets the class's SCHEMA_RULES (and stream_options' need of
    stream where the body has both), in an allOf."""
    rules = list(getattr(cls, "SCHEMA_RULES", ()))
    if "stream_options" in getattr(cls, "model_fields", {}):
        rules.append(needs("stream_options", "stream", True))
    if rules:
        schema.setdefault("allOf", []).extend(rules)


class RequestBody(APIModel):
    """A request's whole body: text that is not Unicode (a lone surrogate) is refused before
    anything reads it, with a 400 naming where it is; a generating endpoint's body (one with
    an ENDPOINT) is judged field by field by api/field_policy.py.

    SCHEMA_RULES: what the document states of the body beyond each field's own schema (rules
    between fields), each one the server enforces with a 400."""

    model_config = ConfigDict(json_schema_extra=add_schema_rules)
    ENDPOINT: ClassVar[str]
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = ()

    def sent_fields(self) -> dict[str, Any]:
        """Every field the body was sent with, declared or not, and its value."""
        sent = {name: getattr(self, name) for name in self.model_fields_set}
        return {**sent, **(self.model_extra or {})}

    def check_supported(self, accept_unknown: bool = False) -> None:
        """A 400 for a field this endpoint refuses, or one no API defines (with
        `accept_unknown`: a logged warning); stream_options only with stream, as on
        OpenAI's API."""
        check_fields(self.ENDPOINT, self.sent_fields(), accept_unknown)
        if ("stream_options" in type(self).model_fields and self.stream_options is not None
                and not self.stream):
            raise APIError("stream_options is only allowed with stream: true.",
                           "stream_options")

    @model_validator(mode="before")
    @classmethod
    def whole_characters(cls, value: Any) -> Any:
        where = broken_text_at(value)
        if where is not None:  # an APIError passes through pydantic to the error handler
            raise APIError(f"{where} holds a lone UTF-16 surrogate (such as \\ud800), which "
                           "is not Unicode text.", where)
        return value
