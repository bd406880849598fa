"""Our real responses against OpenAI's published OpenAPI document.

The document (openai-openapi.yaml, ~3 MB) lives outside the repository, in `shared/` next to
it (CI: ../shared/openai-openapi.yaml); NANO_VLLM_OPENAPI names another path. Its schemas
are JSON Schema 2020-12 (OpenAPI 3.1), except that some still say `nullable: true` in
OpenAPI 3.0's way, which 2020-12 ignores; those are rewritten to what they mean (the value
may also be null) before validating. Nothing else is changed.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.api.conftest import MODEL_NAME, RunningServer
from tests.api.test_server import CHAT_HI, PROMPT, chat, complete, send_bad, stream
from tests.conftest import missing

OPENAPI_FILE = Path("shared") / "openai-openapi.yaml"
DOCUMENT_URI = "urn:openai-openapi"


def find_openapi_document() -> Path | None:
    """NANO_VLLM_OPENAPI if set, else shared/openai-openapi.yaml beside or above the repo."""
    if os.environ.get("NANO_VLLM_OPENAPI"):
        return Path(os.environ["NANO_VLLM_OPENAPI"])
    repo_root = Path(__file__).resolve().parents[2]
    for folder in (repo_root, *repo_root.parents):
        if (folder / OPENAPI_FILE).is_file():
            return folder / OPENAPI_FILE
    return None


def nullable_as_json_schema(node: Any) -> Any:
    """Rewrite OpenAPI 3.0's `nullable: true` as 2020-12's anyOf [schema, null]."""
    if isinstance(node, list):
        return [nullable_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: nullable_as_json_schema(value) for key, value in node.items()}
    if node.get("nullable") is True:
        rest = {key: value for key, value in node.items() if key != "nullable"}
        return {"anyOf": [rest, {"type": "null"}]}
    return node


class OpenAISchemas:
    """Validators for the document's components/schemas, resolving $refs within it."""

    def __init__(self, path: Path) -> None:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster
        with path.open() as f:
            document = nullable_as_json_schema(yaml.load(f, Loader=loader))
        self.registry = Registry().with_resource(
            DOCUMENT_URI, Resource.from_contents(document, default_specification=DRAFT202012))
        self.components = document["components"]["schemas"]

    def errors(self, name: str, instance: Any) -> list[str]:
        """Every way `instance` fails schema `name` (empty: it is valid)."""
        assert name in self.components, f"no schema {name} in the document"
        validator = Draft202012Validator(
            {"$ref": f"{DOCUMENT_URI}#/components/schemas/{name}"}, registry=self.registry)
        return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                for e in validator.iter_errors(instance)]

    def check(self, name: str, instance: Any) -> None:
        errors = self.errors(name, instance)
        print(f"{name}: {errors or 'valid'}  <- {instance}")
        assert not errors, f"{name}: {errors}"


@pytest.fixture(scope="module")
def schemas() -> OpenAISchemas:
    path = find_openapi_document()
    if path is None:
        missing("OpenAI's OpenAPI document (put it in shared/ next to the repository or set "
                "NANO_VLLM_OPENAPI)")
    return OpenAISchemas(path)


def test_completion(server: RunningServer, schemas: OpenAISchemas):
    schemas.check("CreateCompletionResponse", complete(server, prompt=PROMPT, max_tokens=4))


def test_completion_stream_last_chunks(server: RunningServer, schemas: OpenAISchemas):
    # The document says stream chunks share CreateCompletionResponse's shape, but its
    # finish_reason allows no null, which every chunk before the last carries (as OpenAI's
    # own stream does). So: the chunk with finish_reason, and the usage chunk.
    events = stream(server, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True,
        "stream_options": {"include_usage": True}})
    *_, last, usage = events
    assert last["choices"][0]["finish_reason"] == "length"
    schemas.check("CreateCompletionResponse", last)
    schemas.check("CreateCompletionResponse", usage)


def test_chat(server: RunningServer, schemas: OpenAISchemas):
    body = chat(server, messages=CHAT_HI, max_tokens=8)
    assert body["choices"][0]["message"]["refusal"] is None
    schemas.check("CreateChatCompletionResponse", body)


@pytest.mark.parametrize(("max_tokens", "finish_reason"), [(16, "stop"), (3, "length")])
def test_chat_stream_every_chunk(server: RunningServer, schemas: OpenAISchemas,
                                 max_tokens: int, finish_reason: str):
    # Greedy, "Hi" gets a short greeting, then end-of-sequence: a last chunk with no text.
    events = stream(server, "/v1/chat/completions", {
        "messages": CHAT_HI, "max_tokens": max_tokens, "temperature": 0,
        "stream_options": {"include_usage": True}})
    print(f"{len(events)} chunks, the last two: {events[-2:]}")
    assert events[-2]["choices"][0]["finish_reason"] == finish_reason
    for event in events:
        schemas.check("CreateChatCompletionStreamResponse", event)


def test_models(server: RunningServer, schemas: OpenAISchemas):
    r = httpx.get(server.url + "/v1/models", timeout=10)
    assert r.status_code == 200
    schemas.check("ListModelsResponse", r.json())


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, 400),
    ("/v1/completions", b'{"prompt": ', 400),
    ("/v1/chat/completions", {"messages": CHAT_HI, "model": "gpt-4"}, 404),
    ("/v1/chat/completions", {"messages": CHAT_HI, "bad_words": ["x"]}, 400),
    ("/v1/nothing", {}, 404),
], ids=["out of range", "malformed JSON", "unknown model", "unsupported", "unknown route"])
def test_errors(server: RunningServer, schemas: OpenAISchemas, path: str, body: Any,
                status: int):
    r = send_bad(server, path, body)
    assert r.status_code == status, r.text
    schemas.check("ErrorResponse", r.json())


def test_the_schemas_can_fail(server: RunningServer, schemas: OpenAISchemas):
    """What the checks above would catch: the chat message without `refusal` (what this
    server sent before), and a finish_reason OpenAI does not know."""
    body = chat(server, messages=CHAT_HI, max_tokens=4)
    no_refusal = copy.deepcopy(body)
    del no_refusal["choices"][0]["message"]["refusal"]
    errors = schemas.errors("CreateChatCompletionResponse", no_refusal)
    print("without refusal:", errors)
    assert any("refusal" in e for e in errors)

    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
             "model": MODEL_NAME, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                               "finish_reason": None}]}
    assert schemas.errors("CreateChatCompletionStreamResponse", chunk) == []  # null allowed
    chunk["choices"][0]["finish_reason"] = "abort"
    errors = schemas.errors("CreateChatCompletionStreamResponse", chunk)
    print("finish_reason 'abort':", errors)
    assert errors


def test_new_fields(server: RunningServer, schemas: OpenAISchemas):
    """logprobs, n, prompt lists, usage details and our `timing` extension."""
    schemas.check("CreateCompletionResponse", complete(
        server, prompt=[PROMPT, "Hi"], max_tokens=3, n=2, logprobs=2))
    schemas.check("CreateChatCompletionResponse", chat(
        server, messages=CHAT_HI, max_tokens=4, n=2, logprobs=True, top_logprobs=2))
    events = stream(server, "/v1/chat/completions", {
        "messages": CHAT_HI, "max_tokens": 4, "temperature": 0, "n": 2, "logprobs": True,
        "top_logprobs": 1, "stream_options": {"include_usage": True,
                                              "continuous_usage_stats": True}})
    for event in events:
        schemas.check("CreateChatCompletionStreamResponse", event)
    *_, last, usage = stream(server, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True,
        "logprobs": 1, "stream_options": {"include_usage": True}})
    schemas.check("CreateCompletionResponse", last)
    schemas.check("CreateCompletionResponse", usage)


def test_echoed_prompt_logprobs_differ_only_by_the_first_tokens_null(
        server: RunningServer, schemas: OpenAISchemas):
    """The document allows no null in token_logprobs and top_logprobs, but OpenAI's own echo
    (and every client that scores prompts, lm-evaluation-harness first) has null for the
    first prompt token, which has no logprob. With that entry filled in, the body is valid."""
    body = complete(server, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    print("as sent:", schemas.errors("CreateCompletionResponse", body))
    filled = copy.deepcopy(body)
    filled["choices"][0]["logprobs"]["token_logprobs"][0] = 0.0
    filled["choices"][0]["logprobs"]["top_logprobs"][0] = {}
    schemas.check("CreateCompletionResponse", filled)
