"""/openapi.json says what the server does, checked by reading it and by fuzzing against it.

The fuzz is schemathesis (its settings and why: tests/api/schemathesis.toml) run against a
real server with an API key and a short --request-timeout, so that no generated max_tokens
runs long: ~800 requests, every response checked against the document (status, content
type, headers, body schema, each SSE event), none may be a server error. The same run
against any server:

    schemathesis --config-file tests/api/schemathesis.toml run \\
        http://127.0.0.1:8080/openapi.json -H "Authorization: Bearer KEY" --max-examples 10
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from api.security import AccessConfig
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from tests.api.conftest import RunningServer, serve

CONFIG = Path(__file__).with_name("schemathesis.toml")
KEY = "fuzz-key"
FUZZ_TIME_LIMIT = 240  # seconds; it takes ~25 here


@pytest.fixture(scope="module")
def fuzz_server(model, tokenizer) -> Iterator[RunningServer]:
    config = EngineConfig(num_blocks=128, max_num_seqs=4, max_waiting=8, request_timeout=0.5)
    yield from serve(BatchEngine(config, model, tokenizer), AccessConfig(api_keys=(KEY,)))


def test_document_is_honest(fuzz_server):
    doc = httpx.get(fuzz_server.url + "/openapi.json", timeout=10).json()
    validate_openapi(doc)  # a valid OpenAPI 3.2 document (its streams' itemSchema is 3.2's)
    assert doc["openapi"] == "3.2.0"
    text = json.dumps(doc)
    assert '"422"' not in text and "HTTPValidationError" not in text
    paths = doc["paths"]
    completions = paths["/v1/completions"]["post"]["responses"]
    print(sorted(completions), sorted(completions["200"]["content"]))
    assert {"200", "400", "401", "404", "429", "503", "504"} <= set(completions)
    assert set(completions["200"]["content"]) == {"application/json", "text/event-stream"}
    for status in ("400", "401", "429"):
        schema = completions[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "Retry-After" in completions["429"]["headers"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "401" not in paths["/metrics"]["get"]["responses"]  # open without the flag
    assert doc["components"]["securitySchemes"]["APIKey"]["scheme"] == "bearer"
    # Either scheme will do: a bearer token, or x-api-key (Anthropic's clients).
    assert paths["/v1/models"]["get"]["security"] == [{"APIKey": []}, {"XAPIKey": []}]
    assert doc["components"]["securitySchemes"]["XAPIKey"]["name"] == "x-api-key"
    # Anthropic's route: its error shape and its named events.
    messages = paths["/v1/messages"]["post"]["responses"]
    for status in ("400", "401", "404", "429", "503"):
        schema = messages[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/AnthropicErrorResponse"}
    events = messages["200"]["content"]["text/event-stream"]["itemSchema"]["anyOf"]
    assert {e["properties"]["event"]["const"] for e in events} == {
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop", "error"}


HI = {"messages": [{"role": "user", "content": "Hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
FUNCTION = {"name": "f", "parameters": {"type": "object"}}
CLAUDE = {"model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}

# Bodies the server refuses with a 400, which the document must refuse too (and one each it
# must allow), by request schema.
REFUSED_BY_THE_DOCUMENT = [
    ("CompletionRequest", {"prompt": ""}, {"prompt": "Hi"}),
    ("CompletionRequest", {"prompt": []}, {"prompt": [1, 2]}),
    ("CompletionRequest", {"prompt": ["Hi", ""]}, {"prompt": ["Hi", "there"]}),
    ("CompletionRequest", {"prompt": [[]]}, {"prompt": [[1]]}),
    ("CompletionRequest", {"prompt": "Hi", "request_timeout": 5e-324},
     {"prompt": "Hi", "request_timeout": 0.001}),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "Hi"}],
                               "top_logprobs": 2},
     {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2, "logprobs": True}),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "Hi"}],
                               "top_logprobs": 0, "logprobs": False},
     {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": None}),
    ("TokenizeRequest", {}, {"prompt": "Hi"}),
    ("TokenizeRequest", {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]},
     {"messages": [{"role": "user", "content": "Hi"}]}),
    ("TokenizeRequest", {"prompt": None, "messages": None}, {"prompt": "Hi", "messages": None}),
    ("DetokenizeRequest", {"tokens": [-1]}, {"tokens": [0, 49151]}),
    ("DetokenizeRequest", {"tokens": [49152]}, {"tokens": [7.0]}),
    ("MessagesRequest", {"model": "default", "messages": [{"role": "user", "content": "Hi"}]},
     {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    ("CountTokensRequest", {"model": "default", "messages": []},
     {"model": "default", "messages": [{"role": "user", "content": "Hi"}]}),
    # Rules between fields, and empty strings the server refuses.
    ("ChatCompletionRequest", {**HI, "tools": [TOOL], "functions": [FUNCTION]},
     {**HI, "tools": [TOOL]}),
    ("ChatCompletionRequest", {**HI, "tool_choice": "none", "function_call": "none"},
     {**HI, "functions": [FUNCTION], "function_call": "none"}),
    ("TokenizeRequest", {**HI, "tools": [TOOL], "functions": [FUNCTION]},
     {**HI, "functions": [FUNCTION]}),
    ("ChatCompletionRequest", {**HI, "guided_regex": ""}, {**HI, "guided_regex": "a+"}),
    ("MessagesRequest", {**CLAUDE, "messages": [{"role": "user", "content": [
        {"type": "text", "text": ""}]}]}, CLAUDE),
    ("CountTokensRequest", {"model": "default", "messages": [{"role": "user", "content": ""}]},
     {"model": "default", "messages": [{"role": "user", "content": "Hi"}]}),
    ("ResponsesRequest", {"input": "Hi", "stream_options": {}},
     {"input": "Hi", "stream_options": None, "max_output_tokens": 1}),
    ("CompletionRequest", {"prompt": "Hi", "stream_options": {"include_usage": True}},
     {"prompt": "Hi", "max_tokens": 1}),
]


@pytest.mark.parametrize(("name", "refused", "allowed"), REFUSED_BY_THE_DOCUMENT)
def test_document_states_what_the_server_refuses(fuzz_server, name, refused, allowed):
    doc = httpx.get(fuzz_server.url + "/openapi.json", timeout=10).json()
    registry = Registry().with_resource("urn:doc", Resource.from_contents(
        doc, default_specification=DRAFT202012))
    validator = Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"},
                                     registry=registry)
    for body, valid in ((refused, False), (allowed, True)):
        errors = [e.message for e in validator.iter_errors(body)]
        status = httpx.post(fuzz_server.url + PATHS[name], json=body, timeout=30,
                            headers={"Authorization": f"Bearer {KEY}"}).status_code
        print(f"{name} {body}: document {errors or 'valid'}; server {status}")
        assert (not errors) == valid
        assert (status != 400) == valid  # the server agrees with the document


PATHS = {"CompletionRequest": "/v1/completions", "ChatCompletionRequest": "/v1/chat/completions",
         "TokenizeRequest": "/tokenize", "DetokenizeRequest": "/detokenize",
         "MessagesRequest": "/v1/messages", "CountTokensRequest": "/v1/messages/count_tokens",
         "ResponsesRequest": "/v1/responses"}


def test_schemathesis_finds_nothing(fuzz_server):
    cli = shutil.which("schemathesis")
    if cli is None:
        pytest.fail("schemathesis is not installed (requirements.txt has it)")
    command = [cli, "--config-file", str(CONFIG), "run", f"{fuzz_server.url}/openapi.json",
               "-H", f"Authorization: Bearer {KEY}", "--max-examples", "10"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=FUZZ_TIME_LIMIT,
                         env={**os.environ, "NO_COLOR": "1"})
    summary = run.stdout[run.stdout.rfind("SUMMARY"):] or run.stdout[-3000:]
    print(summary)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "No issues found" in run.stdout
    assert idle(fuzz_server), "blocks still in use after the fuzz"


def idle(server: RunningServer) -> bool:
    """True once the server's engine has freed every block (waits up to 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.engine.stats()["blocks_used"] == 0:
            return True
        time.sleep(0.05)
    return False
