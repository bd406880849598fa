"""Structured-output fields of a request body, read into one GrammarSpec.

OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}) on chat and, as an extension, on completions;
vLLM's `structured_outputs` ({"json": schema} or {"regex"}, {"choice"}, {"json_object"});
and vLLM's older `guided_json`, `guided_regex`, `guided_choice`. At most one may be given.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from api.errors import APIError
from engine.structured.grammar import GrammarKind, GrammarSpec

STRUCTURED_OUTPUT_KEYS = {"json": GrammarKind.JSON_SCHEMA, "regex": GrammarKind.REGEX,
                          "choice": GrammarKind.CHOICE, "json_object": GrammarKind.JSON_OBJECT}


def grammar_spec(body: Any) -> GrammarSpec | None:
    """The one constraint `body` asks for (None: free text); APIError naming the field when a
    value is malformed, a schema invalid, or two constraints are given."""
    found: list[tuple[str, GrammarSpec]] = []
    if body.response_format is not None:
        spec = from_response_format(body.response_format)
        if spec is not None:
            found.append(("response_format", spec))
    if body.structured_outputs is not None:
        found.append(("structured_outputs", from_structured_outputs(body.structured_outputs)))
    if body.guided_json is not None:
        found.append(("guided_json", json_schema_spec(body.guided_json, "guided_json")))
    if body.guided_regex is not None:
        found.append(("guided_regex", regex_spec(body.guided_regex, "guided_regex")))
    if body.guided_choice is not None:
        found.append(("guided_choice", choice_spec(body.guided_choice, "guided_choice")))
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise APIError(f"Only one structured output may be asked for; got {names}.",
                       found[1][0])
    return found[0][1] if found else None


def from_response_format(value: dict) -> GrammarSpec | None:
    field = "response_format"
    kind = value.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise APIError("response_format.type must be 'text', 'json_object' or 'json_schema'; "
                       f"got {kind!r}.", field)
    check_keys(value, ("type", "json_schema") if kind == "json_schema" else ("type",), field)
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(GrammarKind.JSON_OBJECT, source=field)
    inner = value.get("json_schema")  # the type is json_schema
    if (not isinstance(inner, dict) or not isinstance(inner.get("name"), str)
            or not SCHEMA_NAME.fullmatch(inner["name"]) or "schema" not in inner):
        raise APIError("response_format of type json_schema needs json_schema: {name (1-64 "
                       "letters, digits, _ or -), schema}.", field)
    check_keys(inner, ("name", "schema", "strict", "description"), f"{field}.json_schema")
    if not isinstance(inner.get("strict"), bool | None) or not isinstance(
            inner.get("description"), str | None):
        raise APIError("response_format.json_schema.strict must be a boolean and description "
                       "a string.", field)
    return json_schema_spec(inner["schema"], field)


SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_keys(value: dict, allowed: tuple[str, ...], where: str) -> None:
    """APIError (naming response_format) for a key `value` should not have."""
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise APIError(f"{where} has no field {unknown[0]!r} (it takes "
                       f"{', '.join(allowed)}).", "response_format")


def from_structured_outputs(value: dict) -> GrammarSpec:
    field = "structured_outputs"
    given = {k: v for k, v in value.items() if v is not None and v is not False}
    unknown = set(given) - set(STRUCTURED_OUTPUT_KEYS)
    if unknown:
        raise APIError(f"structured_outputs.{sorted(unknown)[0]} is not supported by this "
                       f"server (it takes one of {', '.join(STRUCTURED_OUTPUT_KEYS)}).", field)
    if len(given) != 1:
        raise APIError(f"structured_outputs takes exactly one of "
                       f"{', '.join(STRUCTURED_OUTPUT_KEYS)}.", field)
    key, item = next(iter(given.items()))
    if key == "json":
        return json_schema_spec(item, field)
    if key == "regex":
        return regex_spec(item, field)
    if key == "choice":
        return choice_spec(item, field)
    if item is not True:
        raise APIError("structured_outputs.json_object must be true.", field)
    return GrammarSpec(GrammarKind.JSON_OBJECT, source=field)


def json_schema_spec(schema: Any, field: str) -> GrammarSpec:
    """A JSON schema (an object, or its JSON text), checked against its metaschema."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise APIError(f"The JSON schema in {field} is not valid JSON: {exc}.",
                           field) from exc
    if not isinstance(schema, dict):
        raise APIError(f"The JSON schema in {field} must be an object.", field)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise APIError(f"Invalid JSON schema in {field}: {exc.message}.", field) from exc
    return GrammarSpec(GrammarKind.JSON_SCHEMA, schema, field)


def regex_spec(pattern: Any, field: str) -> GrammarSpec:
    """A regex, in the Rust regex crate's syntax (llguidance's), which checks it."""
    if not isinstance(pattern, str) or not pattern:
        raise APIError(f"The regex in {field} must be a non-empty string.", field)
    return GrammarSpec(GrammarKind.REGEX, pattern, field)


def choice_spec(choices: Any, field: str) -> GrammarSpec:
    if (not isinstance(choices, list) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise APIError(f"The choices in {field} must be a non-empty list of non-empty "
                       "strings.", field)
    return GrammarSpec(GrammarKind.CHOICE, list(choices), field)
