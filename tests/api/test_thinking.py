"""Thinking apart from the answer on every surface, streamed and not, and a thinking budget
honoured exactly: tiny random models with Qwen3's chat template (tests/families.py).

`thinking` is Qwen3's thinking-only form: the template opens `<think>` in the prompt, so all
the output is reasoning until the budget ends it (a random model never closes it itself).
`qwen3` is the hybrid form, whose thinking a request may switch off.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from api.answer import ChatFormat
from api.app import create_app
from benchmarks.live_server import LiveServer
from engine.config import EngineConfig
from engine.load import load_engine
from tests.api.conftest import MODEL_NAME, RunningServer, serve
from tests.api.test_responses_api import check, check_event, schemas  # noqa: F401
from tests.families import save_family

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Hi"}]
# Seeded sampling, not greedy: a random model's greedy answer repeats one token (often a
# newline, which the content's leading whitespace then drops).
SEEDED = {"temperature": 1.0, "seed": 1}


def family_server(family: str, folder: Path, model_dir: Path) -> Iterator[RunningServer]:
    save_family(family, folder, model_dir)
    yield from serve(load_engine(EngineConfig(model=str(folder), num_blocks=96,
                                              max_num_seqs=8)))


@pytest.fixture(scope="module")
def thinking(tmp_path_factory, model_dir) -> Iterator[RunningServer]:
    yield from family_server("qwen3-thinking", tmp_path_factory.mktemp("qwen3-thinking"),
                             model_dir)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, model_dir) -> Iterator[RunningServer]:
    yield from family_server("qwen3", tmp_path_factory.mktemp("qwen3"), model_dir)


def chat(server: RunningServer, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                   json={"messages": HI, **SEEDED, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream_chat(server: RunningServer, **body) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=120,
                      json={"messages": HI, **SEEDED, "stream": True,
                            "stream_options": {"include_usage": True}, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_the_budget_ends_the_thinking_and_the_answer_follows(thinking):
    """The first 6 output tokens are the reasoning, then the template's close, then the
    answer: exactly 6 reasoning tokens, no tag in either part."""
    body = chat(thinking, max_tokens=16, thinking_token_budget=6, logprobs=True)
    message = body["choices"][0]["message"]
    tokens = [entry["token"] for entry in body["choices"][0]["logprobs"]["content"]]
    print(message, tokens)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6
    assert tokens[6:8] == ["</think>", "\n\n"] or "".join(tokens[6:8]) == "</think>\n\n"
    assert message["reasoning_content"] == message["reasoning"] == "".join(tokens[:6]).strip()
    assert message["content"] == "".join(tokens[8:]).lstrip() != ""
    for part in (message["reasoning"], message["content"]):
        assert "<think>" not in part and "</think>" not in part


def test_a_stream_sends_the_same_parts_reasoning_first(thinking, schemas):  # noqa: F811
    body = chat(thinking, max_tokens=16, thinking_token_budget=6)
    check(schemas, "CreateChatCompletionResponse", body)  # its extra fields allowed
    whole = body["choices"][0]["message"]
    chunks = stream_chat(thinking, max_tokens=16, thinking_token_budget=6)
    for chunk in chunks:
        check(schemas, "CreateChatCompletionStreamResponse", chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == "".join(d.get("reasoning", "") for d in deltas) == whole["reasoning"]
    assert "".join(d.get("content", "") for d in deltas) == whole["content"]
    kinds = ["r" if d.get("reasoning") else "c" for d in deltas if d.get("reasoning")
             or d.get("content")]
    assert kinds == sorted(kinds, reverse=True)  # all reasoning before any content
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6


def test_every_sample_keeps_its_budget_and_usage_adds_them(thinking):
    body = chat(thinking, max_tokens=12, thinking_token_budget=3, n=3, temperature=1.0,
                seed=5)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 9
    for choice in body["choices"]:
        assert choice["message"]["reasoning"] and "</think>" not in choice["message"]["content"]


def test_no_budget_means_all_reasoning_until_max_tokens(thinking):
    body = chat(thinking, max_tokens=7)
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert message["content"] == "" and message["reasoning"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 7


def test_a_zero_budget_thinks_not_at_all(thinking):
    body = chat(thinking, max_tokens=8, thinking_token_budget=0)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert body["choices"][0]["message"]["reasoning"] == ""


def test_a_stop_string_in_the_answer_ends_it_after_the_thinking(thinking):
    free = chat(thinking, max_tokens=16, thinking_token_budget=4)["choices"][0]["message"]
    stop = free["content"][2:5]
    assert stop.strip(), free
    body = chat(thinking, max_tokens=16, thinking_token_budget=4, stop=[stop])
    message = body["choices"][0]["message"]
    assert message["reasoning"] == free["reasoning"]
    assert message["content"] == free["content"][:free["content"].index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_the_server_default_budget_and_a_request_own(thinking):
    engine = thinking.engine
    bounded = ChatFormat.of(engine.tokenizer, thinking_budget=2)
    with TestClient(create_app(engine, MODEL_NAME, chat_format=bounded)) as client:
        request = {"messages": HI, "max_tokens": 10, **SEEDED}
        by_default = client.post("/v1/chat/completions", json=request).json()
        own = client.post("/v1/chat/completions",
                          json={**request, "thinking_token_budget": 5}).json()
    assert by_default["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2
    assert own["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


def test_the_responses_api_gives_a_reasoning_item(thinking, schemas):  # noqa: F811
    client = openai.OpenAI(base_url=f"{thinking.url}/v1", api_key="x")
    response = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=14,
                                       temperature=0, extra_body={})
    # no budget field here: the whole output is reasoning, up to the limit
    assert [item.type for item in response.output] == ["reasoning"]
    assert response.usage.output_tokens_details.reasoning_tokens == 14
    events = list(client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=14,
                                          temperature=0, stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert "".join(deltas) == done[0].text == response.output[0].content[0].text
    check(schemas, "Response", response.to_dict())  # as it came
    for event in events:
        check_event(schemas, event.to_dict())


def test_messages_give_a_thinking_block_then_text(thinking):
    """Anthropic's API has no seed: the answers are sampled freely, so their parts are
    checked, not their text (a random model at temperature 1 writes some non-space text)."""
    client = anthropic.Anthropic(base_url=thinking.url, api_key="x")
    ask = {"model": MODEL_NAME, "max_tokens": 16, "messages": HI,
           "thinking": {"type": "enabled", "budget_tokens": 6}}
    message = client.messages.create(**ask)
    assert [block.type for block in message.content] == ["thinking", "text"]
    for text in (message.content[0].thinking, message.content[1].text):
        assert text and "<think>" not in text and "</think>" not in text
    with client.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.delta.type for event in events if event.type == "content_block_delta"]
    assert kinds == sorted(kinds, reverse=True) and set(kinds) == {"thinking_delta",
                                                                   "text_delta"}
    thought = "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                      and e.delta.type == "thinking_delta")
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == thought


def test_thinking_switched_off_renders_the_empty_block(qwen3):
    """enable_thinking false (or reasoning_effort none, or Anthropic's disabled): the
    template closes an empty span in the prompt, and the answer is all content."""
    url = qwen3.url
    plain = httpx.post(f"{url}/tokenize", json={"messages": HI}).json()
    off = httpx.post(f"{url}/tokenize", json={
        "messages": HI, "chat_template_kwargs": {"enable_thinking": False}}).json()
    tokenizer = qwen3.engine.tokenizer
    added = tokenizer.decode(off["tokens"][len(plain["tokens"]):])
    assert off["tokens"][:len(plain["tokens"])] == plain["tokens"]
    assert added == "<think>\n\n</think>\n\n"
    body = chat(qwen3, max_tokens=6, reasoning_effort="none")
    assert "reasoning" not in body["choices"][0]["message"]
    assert body["usage"]["prompt_tokens"] == off["count"]
    counted = httpx.post(f"{url}/v1/messages/count_tokens", json={
        "model": MODEL_NAME, "messages": HI, "thinking": {"type": "disabled"}}).json()
    assert counted["input_tokens"] == off["count"]


def test_an_output_that_opens_its_own_span(qwen3):
    """Qwen3's hybrid form: the output opens the span itself (steered here: the open tag
    biased up, so every token is one), the budget closes it."""
    open_id = qwen3.engine.tokenizer.convert_tokens_to_ids("<think>")
    body = chat(qwen3, max_tokens=10, thinking_token_budget=3,
                logit_bias={str(open_id): 100})
    message = body["choices"][0]["message"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    assert message["reasoning"] == "<think>" * 3  # the biased token, written inside


def test_a_model_that_does_not_think_has_no_reasoning_fields(server):
    body = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": HI, "max_tokens": 4, "thinking_token_budget": 1,
        "reasoning_effort": "high"}).json()
    assert set(body["choices"][0]["message"]) == {"role", "content", "refusal"}
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_through_the_engine_process(tmp_path, model_dir):
    """As `python3 server.py` serves it: the budget crosses to the engine core process with
    the request, the count comes back with the outputs, the startup line names the parser."""
    folder = save_family("qwen3-thinking", tmp_path / "model", model_dir)
    log = tmp_path / "server.log"
    with LiveServer([sys.executable, "server.py", "--model", str(folder), "--port", "{port}",
                     "--num-blocks", "64", "--tool-call-parser", "hermes"], log,
                    cwd=ROOT) as server:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "messages": HI, "max_tokens": 12, "thinking_token_budget": 5, **SEEDED})
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5
    assert r.json()["choices"][0]["message"]["reasoning"]
    assert "thinking parsed as qwen3; tool calls in hermes syntax" in log.read_text()
