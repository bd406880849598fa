"""Structured outputs and logits processors through the API, with the official client:
response_format on chat (and on completions, our extension), vLLM's structured_outputs and
guided_* fields, and the 400s for invalid, conflicting or too-slow grammars."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest

from api.app import create_app
from tests.api.conftest import MODEL_NAME, RunningServer

ITEM = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "blue"]},
                   "maxItems": 2},
    },
    "required": ["item", "count", "colors"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Give me one shopping item as JSON."}]


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "item", "schema": schema,
                                                   "strict": True}}


def test_chat_json_schema_with_the_openai_client(client: openai.OpenAI):
    """Four seeded samples, streamed and not: each validates, and ends with stop."""
    for seed in range(2):
        r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=80,
                                           temperature=1.0, seed=seed, n=2,
                                           response_format=schema_format(ITEM))
        for choice in r.choices:
            print(f"seed {seed}: {choice.message.content!r} {choice.finish_reason}")
            jsonschema.validate(json.loads(choice.message.content), ITEM)
            assert choice.finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=80, temperature=0, stream=True,
        response_format=schema_format(ITEM)))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    print("streamed:", repr(text))
    jsonschema.validate(json.loads(text), ITEM)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object_and_completions_extension(client: openai.OpenAI):
    ask = [{"role": "user", "content": "Give the name and age of a person as a JSON object."}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=ask, max_tokens=60,
                                       temperature=0, response_format={"type": "json_object"})
    print("json_object:", repr(r.choices[0].message.content))
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=MODEL_NAME, prompt="A shopping item in JSON:",
                                  max_tokens=80, temperature=0,
                                  extra_body={"response_format": schema_format(ITEM)})
    print("completions:", repr(r.choices[0].text))
    jsonschema.validate(json.loads(r.choices[0].text), ITEM)


def test_structured_outputs_regex_choice_and_guided_fields(client: openai.OpenAI):
    ask = [{"role": "user", "content": "Is the sky green?"}]
    answers = set()
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL_NAME, messages=ask, max_tokens=10, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"choice": ["Yes", "No", "Maybe"]}})
        answers.add(r.choices[0].message.content)
    print("choices:", answers)
    assert answers <= {"Yes", "No", "Maybe"}
    r = client.completions.create(model=MODEL_NAME, prompt="A date: ", max_tokens=20,
                                  temperature=0,
                                  extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"})
    print("regex:", repr(r.choices[0].text))
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", r.choices[0].text)
    r = client.completions.create(model=MODEL_NAME, prompt="Pick:", max_tokens=5,
                                  temperature=0, extra_body={"guided_choice": ["cat", "dog"]})
    assert r.choices[0].text in {"cat", "dog"}


def test_penalties_and_logit_bias_change_the_answer(client: openai.OpenAI, tokenizer):
    base = dict(model=MODEL_NAME, prompt="One, two, three, one, two, three,", max_tokens=8,
                temperature=0)
    plain = client.completions.create(**base).choices[0].text
    penalized = client.completions.create(**base, frequency_penalty=2.0,
                                          presence_penalty=1.0).choices[0].text
    target = tokenizer.encode(" banana", add_special_tokens=False)[0]
    biased = client.completions.create(**base, logit_bias={str(target): 100}).choices[0].text
    print(f"plain {plain!r}, penalized {penalized!r}, biased {biased!r}")
    assert penalized != plain
    assert biased == " banana" * 8


BAD = [
    ("invalid schema", {"response_format": schema_format({"type": "object",
                                                          "properties": {"a": {"type": 5}}})},
     "response_format"),
    ("unknown response_format", {"response_format": {"type": "xml"}}, "response_format"),
    ("schema missing", {"response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format"),
    ("name missing", {"response_format": {"type": "json_schema",
                                          "json_schema": {"schema": ITEM}}}, "response_format"),
    ("name with a space", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "an item", "schema": ITEM}}}, "response_format"),
    ("strict a string", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "item", "schema": ITEM, "strict": "yes"}}}, "response_format"),
    ("a key json_schema lacks", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "item", "schema": ITEM, "schma": {}}}}, "response_format"),
    ("an unknown type with a schema", {"response_format": {"type": "json", "schema": ITEM}},
     "response_format"),
    ("a key json_object lacks", {"response_format": {"type": "json_object", "schema": ITEM}},
     "response_format"),
    ("invalid regex", {"structured_outputs": {"regex": "(ab"}}, "structured_outputs"),
    ("empty choice", {"structured_outputs": {"choice": []}}, "structured_outputs"),
    ("two keys", {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ("unsupported key", {"structured_outputs": {"grammar": "root ::= x"}},
     "structured_outputs"),
    ("two constraints", {"response_format": {"type": "json_object"}, "guided_regex": "a"},
     "guided_regex"),
    ("schema too large", {"guided_json": {"enum": [f"v{i}" for i in range(200_000)]}},
     "guided_json"),
]


@pytest.mark.parametrize(("name", "extra", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_structured_outputs_are_400(server: RunningServer, name: str, extra: dict,
                                        param: str):
    r = httpx.post(f"{server.url}/v1/chat/completions",
                   json={"messages": ASK, "max_tokens": 4, **extra}, timeout=60)
    print(name, r.status_code, r.text[:300])
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_a_grammar_too_slow_to_compile_is_400(server: RunningServer):
    """The same engine behind an app whose compile limit is 2 ms: 20,000 enum values (~45 ms
    to compile here) get a 400 naming the limit; right after it (that compile may still be
    running), a tiny grammar still runs, through an app with the default limit (2 ms is too
    tight to promise even a tiny compile on a busy 2-core machine)."""
    app = create_app(server.engine, MODEL_NAME, grammar_timeout=0.002)
    roomy = create_app(server.engine, MODEL_NAME)
    big = {"type": "string", "enum": [f"w{i}" for i in range(20_000)]}

    async def ask() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            await http.post("/v1/completions", json={  # builds the tokenizer's view once
                "prompt": "x", "max_tokens": 1, "guided_choice": ["a"]})
            slow = await http.post("/v1/completions", json={
                "prompt": "Pick a word:", "max_tokens": 8, "guided_json": big})
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=roomy),
                                     base_url="http://app") as http:
            fast = await http.post("/v1/completions", json={
                "prompt": "Pick:", "max_tokens": 4, "temperature": 0,
                "guided_choice": ["up", "down"]})
        return slow, fast

    slow, fast = asyncio.run(ask())
    print(slow.status_code, slow.text, fast.status_code, fast.text[:200])
    assert slow.status_code == 400
    assert "did not compile within 0.002 s" in slow.json()["error"]["message"]
    assert slow.json()["error"]["param"] == "guided_json"
    assert fast.status_code == 200 and fast.json()["choices"][0]["text"] in {"up", "down"}
