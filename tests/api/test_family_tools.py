"""Tool calls in each family's own syntax, served: tiny random models with Qwen3's template
(Hermes-style calls) and Llama 3's (JSON with "parameters"), their calls constrained by the
grammar, read back as tool_calls on every surface, streamed and not, with no markup left in
content; and a thinking model that thinks first, then calls."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.api.conftest import MODEL_NAME, RunningServer
from tests.api.test_thinking import family_server

CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                         "days": {"type": "integer", "minimum": 1,
                                                  "maximum": 9}},
        "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "The weather in a city.",
                                           "parameters": CITY}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# The hybrid Qwen3 template's thinking is switched off here, unless a test is about it: a
# random model under the call grammar would open a span (allowed first) half the time, and
# never close it.
MARKUP = ("<tool_call>", "</tool_call>", "<think>", "</think>", '"name"', "<|python_tag|>")


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def family(request, tmp_path_factory, model_dir) -> Iterator[RunningServer]:
    yield from family_server(request.param, tmp_path_factory.mktemp(request.param), model_dir)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, model_dir) -> Iterator[RunningServer]:
    yield from family_server("qwen3-thinking", tmp_path_factory.mktemp("thinker"), model_dir)


def chat(server: RunningServer, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "messages": ASK, "tools": TOOLS, "temperature": 1.0, "seed": 2, "max_tokens": 60,
        "reasoning_effort": "none", **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_calls_come_back_as_tool_calls(family, choice):
    answer = chat(family, tool_choice=choice)
    message = answer["message"]
    assert answer["finish_reason"] == "tool_calls" and message["content"] is None, answer
    for call in message["tool_calls"]:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)


def test_a_stream_joins_into_the_same_calls(family):
    client = openai.OpenAI(base_url=f"{family.url}/v1", api_key="x")
    whole = chat(family, tool_choice="required")["message"]["tool_calls"]
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
        seed=2, max_tokens=60, stream=True, reasoning_effort="none")
    arguments: dict[int, str] = {}
    for chunk in stream:
        delta = chunk.choices[0].delta
        assert not delta.content or not any(tag in delta.content for tag in MARKUP)
        for call in delta.tool_calls or []:
            arguments[call.index] = arguments.get(call.index, "") + (
                call.function.arguments or "")
    assert [arguments[i] for i in range(len(whole))] == [
        c["function"]["arguments"] for c in whole]


def test_other_surfaces_read_the_same_calls(family):
    messages = anthropic.Anthropic(base_url=family.url, api_key="x").messages.create(
        model=MODEL_NAME, max_tokens=60, messages=ASK,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "disabled"},
        tools=[{"name": "get_weather", "description": "The weather in a city.",
                "input_schema": CITY}])
    assert {block.type for block in messages.content} == {"tool_use"}
    assert messages.stop_reason == "tool_use"
    for block in messages.content:
        jsonschema.validate(block.input, CITY)
    response = openai.OpenAI(base_url=f"{family.url}/v1", api_key="x").responses.create(
        model=MODEL_NAME, input="Weather in Paris?", tool_choice="required",
        reasoning={"effort": "none"},
        tools=[{"type": "function", "name": "get_weather", "parameters": CITY}])
    assert {item.type for item in response.output} == {"function_call"}
    for item in response.output:
        jsonschema.validate(json.loads(item.arguments), CITY)


def test_history_calls_render_in_the_family_syntax(family):
    """An earlier call and its result go to the template, which writes them its own way."""
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    tokens = httpx.post(f"{family.url}/tokenize", json={
        "messages": history, "tools": TOOLS, "return_token_strs": True}).json()["token_strs"]
    text = "".join(tokens).replace("Ġ", " ").replace("Ċ", "\n")
    assert ('"arguments": {"city": "Paris", "days": 1}' in text
            or '"parameters": {"city": "Paris", "days": 1}' in text), text


def test_a_thinking_model_thinks_then_calls(thinker):
    answer = chat(thinker, tool_choice="required", thinking_token_budget=4, max_tokens=80,
                  parallel_tool_calls=False, reasoning_effort="high")
    message = answer["message"]
    assert message["reasoning"] and message["content"] is None, answer
    assert answer["finish_reason"] == "tool_calls"
    for call in message["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)
