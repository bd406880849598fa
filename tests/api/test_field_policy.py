"""The field policy (api/field_policy.py): every field OpenAI's schema defines for the two
generating endpoints is classified, the table agrees with what the request bodies declare,
and over HTTP a refused field is a 400 naming it, a no-effect field is accepted, and an
unknown field is a 400 naming it (accepted and logged once with --accept-unknown-fields)."""

from __future__ import annotations

import logging

import httpx
import pytest
import yaml

from api.field_policy import CHAT, COMPLETIONS, POLICIES, Status, render_markdown
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from tests.api.test_openapi_schema import find_openapi_document
from tests.conftest import missing

SCHEMAS = {COMPLETIONS: "CreateCompletionRequest", CHAT: "CreateChatCompletionRequest"}
BODIES = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest}
ASK = {COMPLETIONS: {"prompt": "Hello", "max_tokens": 2},
       CHAT: {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}


def schema_properties(schemas: dict, name: str) -> set[str]:
    """A schema's properties, through allOf and $ref."""
    schema = schemas[name]
    found = set(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        if "$ref" in part:
            found |= schema_properties(schemas, part["$ref"].rsplit("/", 1)[-1])
        found |= set(part.get("properties", {}))
    return found


@pytest.fixture(scope="module")
def openai_schemas() -> dict:
    path = find_openapi_document()
    if path is None:
        missing("OpenAI's OpenAPI document (shared/openai-openapi.yaml)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader)["components"]["schemas"]


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_every_openai_field_is_classified(openai_schemas, endpoint):
    properties = schema_properties(openai_schemas, SCHEMAS[endpoint])
    assert len(properties) > 15  # the walk through allOf found the schema's fields
    missing = properties - set(POLICIES[endpoint])
    assert not missing, f"{endpoint}: fields with no policy: {sorted(missing)}"


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_table_agrees_with_the_request_body(endpoint):
    """A declared field is read (implemented or no effect); an implemented one is declared,
    so that it cannot be dropped unread; every rule says why."""
    declared = set(BODIES[endpoint].model_fields)
    table = POLICIES[endpoint]
    assert declared <= set(table), sorted(declared - set(table))
    for name, rule in table.items():
        assert rule.reason, name
        if rule.status is Status.IMPLEMENTED:
            assert name in declared, f"{name} is implemented but not declared"
        if name in declared:
            assert rule.status is not Status.REFUSED, f"{name} is declared yet refused"


def test_markdown_lists_every_field():
    text = render_markdown()
    for endpoint, table in POLICIES.items():
        assert f"### `{endpoint}`" in text
        for name, rule in table.items():
            assert f"| `{name}` | {rule.origin} | {rule.status} |" in text


@pytest.mark.parametrize("endpoint, field, value", [
    (COMPLETIONS, "suffix", " and so on."),
    (COMPLETIONS, "bad_words", ["cat"]),
    (CHAT, "guided_grammar", "start: \"a\""),
    (CHAT, "include_stop_str_in_output", True),
    (CHAT, "add_generation_prompt", False),
    (CHAT, "continue_final_message", True),
    (CHAT, "echo", True),
    (CHAT, "audio", {"voice": "alloy", "format": "wav"}),
    (CHAT, "modalities", ["text", "audio"]),
])
def test_refused_field_is_a_400_naming_it(server, endpoint, field, value):
    r = httpx.post(server.url + endpoint, json={**ASK[endpoint], field: value}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field
    assert field in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("endpoint, field, value", [
    (COMPLETIONS, "suffix", ""),  # asks for nothing
    (CHAT, "add_generation_prompt", True),  # what the server does anyway
    (CHAT, "include_stop_str_in_output", False),
    (CHAT, "modalities", ["text"]),
    (CHAT, "user", "someone"),
    (CHAT, "metadata", {"team": "a"}),
    (CHAT, "store", True),
    (CHAT, "service_tier", "auto"),
    (CHAT, "reasoning_effort", "none"),
    (COMPLETIONS, "user", "someone"),
])
def test_inert_and_no_effect_fields_are_accepted(server, endpoint, field, value):
    """Accepted, and the greedy answer is the one without the field."""
    greedy = {**ASK[endpoint], "temperature": 0, "max_tokens": 6}
    without = httpx.post(server.url + endpoint, json=greedy, timeout=60)
    r = httpx.post(server.url + endpoint, json={**greedy, field: value}, timeout=60)
    assert without.status_code == r.status_code == 200, r.text
    answers = [answer(endpoint, x.json()) for x in (without, r)]
    print(f"{field}={value!r}: {answers[1]!r}; without it: {answers[0]!r}")
    assert answers[0] == answers[1]
    # (The second may find the first's prompt in the prefix cache: the counts, not where
    # the prompt's tokens came from, must be the same.)
    counts = [{k: v for k, v in x.json()["usage"].items() if k != "prompt_tokens_details"}
              for x in (without, r)]
    assert counts[0] == counts[1]


def answer(endpoint: str, body: dict) -> str:
    choice = body["choices"][0]
    return choice["text"] if endpoint == COMPLETIONS else choice["message"]["content"]


@pytest.mark.parametrize("endpoint, body", [
    (COMPLETIONS, {"prompt": "Hi", "max_tokenz": 2}),
    (CHAT, {"messages": [{"role": "user", "content": "Hi"}], "temprature": 0}),
    ("/v1/responses", {"input": "Hi", "max_output_tokenz": 2}),
    ("/v1/messages", {"model": "default", "max_tokens": 2, "messages": [
        {"role": "user", "content": "Hi"}], "stop_sequence": ["."]}),
])
def test_unknown_field_is_a_400_naming_it(server, endpoint, body):
    r = httpx.post(server.url + endpoint, json=body, timeout=30)
    print(r.text)
    assert r.status_code == 400
    unknown = next(name for name in body if name.endswith(("z", "temprature", "sequence")))
    if endpoint == "/v1/messages":
        assert unknown in r.json()["error"]["message"]
    else:
        assert r.json()["error"]["param"] == unknown
        assert unknown in r.json()["error"]["message"]


def test_unknown_field_accepted_and_logged_once_when_the_server_says_so(tokenizer, caplog):
    """--accept-unknown-fields: vLLM's way, a warning in the log once per name."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tests.api.test_security import FakeEngine

    name = "a_field_no_api_defines"
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], name: 1}
    with caplog.at_level(logging.WARNING, logger="nano_vllm.api"):
        for accept in (False, True, True):
            app = create_app(FakeEngine(tokenizer), "m", accept_unknown_fields=accept)
            with TestClient(app) as http:
                r = http.post("/v1/messages/count_tokens", json=body)
            assert r.status_code == (200 if accept else 400), r.text
    warnings = [rec for rec in caplog.records if name in rec.getMessage()]
    assert len(warnings) == 1, [rec.getMessage() for rec in warnings]
    assert warnings[0].levelno == logging.WARNING
