"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) with the official
`anthropic` client against a real server: text, system, stop sequences, max_tokens, streams
that reassemble, tool_use under `any` and `tool` whose input validates, a history with
tool_use and tool_result, token counts; errors in Anthropic's shape naming the field; the
key in x-api-key; and every field of the SDK's request classified by the field policy."""

from __future__ import annotations

import json
import typing

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, message_count_tokens_params, message_create_params
from anthropic.types.beta import message_create_params as beta_message_create_params
from fastapi.testclient import TestClient

from api.app import create_app
from api.field_policy import COUNT_TOKENS, MESSAGES, POLICIES, Status
from api.messages.protocol import CountTokensRequest, MessagesRequest
from api.security import AccessConfig
from engine.admission import EngineUnavailableError, QueueFullError
from engine.request import FinishReason, RequestOutput
from tests.api.conftest import MODEL_NAME
from tests.api.test_security import FakeEngine

WEATHER = {"name": "get_weather", "description": "The weather now in a city.",
           "input_schema": {"type": "object",
                            "properties": {"city": {"type": "string", "maxLength": 20},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"name": "get_time", "description": "The time in a time zone.",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string",
                                                                   "maxLength": 10}},
                         "required": ["zone"], "additionalProperties": False}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {tool["name"]: tool["input_schema"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the SDK dropped temperature from its signature: extra_body


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)


def text_of(message: Message) -> str:
    assert [block.type for block in message.content] in ([], ["text"]), message.content
    return "".join(block.text for block in message.content)


def check_tool_use(message: Message, names=tuple(SCHEMAS)) -> list:
    """Only tool_use blocks, to allowed tools, whose input validates; stop_reason tool_use."""
    print("tool_use:", [(b.name, b.input) for b in message.content], message.stop_reason)
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    assert message.content and all(block.type == "tool_use" for block in message.content)
    for block in message.content:
        assert block.id.startswith("toolu_") and block.name in names
        jsonschema.validate(block.input, SCHEMAS[block.name])
    return message.content


def test_text_with_a_system_prompt(claude):
    r = claude.messages.create(model=MODEL_NAME, max_tokens=12, messages=ASK,
                               system="You answer in one short sentence.", extra_body=GREEDY)
    print(r)
    assert isinstance(r, Message) and r.id.startswith("msg_") and r.role == "assistant"
    assert r.model == MODEL_NAME and r.type == "message"
    assert text_of(r) and r.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= r.usage.output_tokens <= 12
    counted = claude.messages.count_tokens(model=MODEL_NAME, messages=ASK,
                                           system="You answer in one short sentence.")
    assert prompt_tokens(r.usage) == counted.input_tokens  # the prompt that ran
    # A system prompt as text blocks is the same prompt.
    blocks = [{"type": "text", "text": "You answer in one short sentence."}]
    assert claude.messages.count_tokens(model=MODEL_NAME, messages=ASK,
                                        system=blocks).input_tokens == counted.input_tokens
    longer = claude.messages.count_tokens(
        model=MODEL_NAME, messages=ASK,
        system="You answer in one short sentence, politely.").input_tokens
    print("input tokens:", counted.input_tokens, "with a longer system prompt:", longer)
    assert longer > counted.input_tokens


def prompt_tokens(usage) -> int:
    """The whole prompt: Anthropic's usage splits it into three counts."""
    return (usage.input_tokens + usage.cache_read_input_tokens
            + usage.cache_creation_input_tokens)


def test_usage_splits_the_prompt_by_the_prefix_cache(claude):
    """The same prompt twice: the second reads the first's blocks from the prefix cache and
    says so in cache_read_input_tokens, the three input counts still adding up to the prompt,
    and a stream's message_start splits it as its final message does."""
    system = "You are a careful assistant. " * 8  # several blocks of the cache
    request = dict(model=MODEL_NAME, max_tokens=2, messages=ASK, system=system,
                   extra_body=GREEDY)
    counted = claude.messages.count_tokens(model=MODEL_NAME, messages=ASK, system=system)
    claude.messages.create(**request)
    again = claude.messages.create(**request)
    print(counted.input_tokens, again.usage)
    assert again.usage.cache_creation_input_tokens == 0
    assert 16 <= again.usage.cache_read_input_tokens < counted.input_tokens
    assert prompt_tokens(again.usage) == counted.input_tokens
    with claude.messages.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = events[0]
    assert start.type == "message_start" and start.message.usage.output_tokens == 0
    assert start.message.usage.model_copy(update={"output_tokens": 2}) == final.usage
    assert final.usage.cache_read_input_tokens == again.usage.cache_read_input_tokens


def test_the_anthropic_client_lists_and_gets_the_model(claude):
    """/v1/models carries Anthropic's fields beside OpenAI's, so `models.list()` and
    `models.retrieve()` of the anthropic client read it too."""
    (model,) = list(claude.models.list())
    print(model)
    assert model.id == MODEL_NAME and model.type == "model" and model.display_name == MODEL_NAME
    assert model.created_at.tzinfo is not None  # parsed from RFC 3339
    assert claude.models.retrieve("default") == model
    page = claude.models.list()
    assert page.has_more is False and page.first_id == page.last_id == MODEL_NAME
    assert list(claude.models.list(after_id=page.last_id)) == []  # a client paging by hand
    assert list(claude.models.list(before_id=page.first_id)) == []


def test_stop_sequences_and_max_tokens(claude):
    ask = [{"role": "user", "content": "Count from one to twenty in words."}]
    full = claude.messages.create(model=MODEL_NAME, max_tokens=16, messages=ask,
                                  extra_body=GREEDY)
    text = text_of(full)
    words = text.split()
    print("full:", repr(text), full.stop_reason)
    assert full.stop_reason == "max_tokens" and full.usage.output_tokens == 16
    stop = words[len(words) // 2]  # a word from the middle: the greedy answer reaches it
    cut = claude.messages.create(model=MODEL_NAME, max_tokens=16, messages=ask,
                                 stop_sequences=["never-appears", stop], extra_body=GREEDY)
    print("stop at", repr(stop), "->", repr(text_of(cut)), cut.stop_reason, cut.stop_sequence)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert text_of(cut) == text[:text.index(stop)]


def test_stream_reassembles_to_the_message(claude):
    request = dict(model=MODEL_NAME, max_tokens=10, messages=ASK, extra_body=GREEDY)
    whole = claude.messages.create(**request)
    with claude.messages.stream(**request) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    print("pieces:", pieces, "final:", final)
    assert len(pieces) > 1 and "".join(pieces) == text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage)
    assert whole._request_id and stream.request_id  # the SDK reads them from request-id


def test_raw_events_and_bodies_parse_into_the_sdk_types(server):
    body = {"model": MODEL_NAME, "max_tokens": 4, "messages": ASK, "temperature": 0}
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=60,
                   headers={"anthropic-version": "2023-06-01", "anthropic-beta": "x"})
    assert r.status_code == 200, r.text
    message = Message.model_validate(r.json())
    assert message.usage.output_tokens == 4 and message.stop_reason == "max_tokens"
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True},
                      timeout=60) as stream:
        lines = [line for line in stream.iter_lines() if line and not line.startswith(":")]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    datas = [json.loads(line.removeprefix("data: ")) for line in lines
             if line.startswith("data: ")]
    print(names)
    assert [d["type"] for d in datas] == names  # each event is named by its type
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[2:-3]) == {"content_block_delta"}
    start = Message.model_validate(datas[0]["message"])
    assert start.content == [] and start.usage.output_tokens == 0
    assert prompt_tokens(start.usage) == prompt_tokens(message.usage)
    assert datas[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert datas[-2]["usage"] == {**start.usage.model_dump(exclude_none=True),
                                  "output_tokens": 4}


@pytest.mark.parametrize("choice, names", [
    ({"type": "any"}, tuple(SCHEMAS)),
    ({"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}, ("get_time",)),
])
def test_tool_choice_gives_tool_use_that_validates(claude, choice, names):
    request = dict(model=MODEL_NAME, max_tokens=80, messages=ASK, tools=TOOLS,
                   tool_choice=choice, extra_body=GREEDY)
    blocks = check_tool_use(claude.messages.create(**request), names)
    if choice.get("disable_parallel_tool_use"):
        assert len(blocks) == 1
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()
    streamed = check_tool_use(final, names)
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in blocks]


def test_history_with_tool_use_and_tool_result(claude):
    history = [*ASK,
               {"role": "assistant", "content": [
                   {"type": "text", "text": "Let me look."},
                   {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                    "input": {"city": "Paris", "unit": "celsius"}}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "18 degrees, sunny"}]},
                   {"type": "text", "text": "So, what is it like?"}]}]
    r = claude.messages.create(model=MODEL_NAME, max_tokens=12, messages=history, tools=TOOLS,
                               tool_choice={"type": "none"}, extra_body=GREEDY)
    print(r.content)
    assert text_of(r) and r.stop_reason in ("end_turn", "max_tokens")
    longer = claude.messages.count_tokens(model=MODEL_NAME, messages=history, tools=TOOLS,
                                          tool_choice={"type": "none"}).input_tokens
    shorter = claude.messages.count_tokens(model=MODEL_NAME, messages=ASK).input_tokens
    # tool_choice none shows no tools: the prompt is the history's alone.
    assert prompt_tokens(r.usage) == longer > shorter


def test_count_tokens_counts_the_tools(claude):
    def count(**extra) -> int:
        return claude.messages.count_tokens(model=MODEL_NAME, messages=ASK,
                                            **extra).input_tokens

    plain, offered = count(), count(tools=TOOLS)
    print("without tools", plain, "with", offered)
    assert offered > plain + 20  # two schemas and the call format
    assert count(tools=TOOLS, tool_choice={"type": "none"}) == plain  # none shows no tools


TOOL_RESULT_UNMATCHED = [*ASK, {"role": "assistant", "content": "Hm."},
                         {"role": "user", "content": [{"type": "tool_result",
                                                       "tool_use_id": "toolu_9",
                                                       "content": "18"}]}]
CALLED = [*ASK, {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
     "input": {"city": "Paris", "unit": "celsius"}}]}]
UNANSWERED = [*CALLED, {"role": "user", "content": "Well?"}]
ANSWERED = [*CALLED, {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 degrees"}]}]
TAGGED = [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                        "cache_control": {"type": "bogus"}}]}]
BAD_SCHEMA = {"name": "f", "input_schema": {"type": "object", "properties": {
    "x": {"type": "string", "pattern": "(?<=a)b"}}}}  # a valid schema; llguidance has no lookbehind


@pytest.mark.parametrize("change, status, field", [
    ({"max_tokens": None}, 400, "max_tokens"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, 400, "tool_choice"),
    ({"tools": [BAD_SCHEMA], "tool_choice": {"type": "any"}}, 400, "tools"),
    ({"tools": [{"name": "f", "input_schema": {"type": 5}}]}, 400, "input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools"),
    ({"messages": TOOL_RESULT_UNMATCHED}, 400, "tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "image"),
    ({"messages": [*ASK, {"role": "assistant", "content": "The weather"}]}, 400, "prefill"),
    ({"stop_sequences": [""]}, 400, "stop_sequences"),
    ({"thinking": {"type": "enabled"}}, 400, "budget_tokens"),  # enabled needs a budget
    ({"model": "no-such-model"}, 404, "model"),
    ({"tool_choice": "auto"}, 400, "tool_choice"),  # OpenAI's spelling, not an object
    ({"messages": ["Hi"]}, 400, "messages.0"),
    ({"messages": [{"role": "user", "content": ""}]}, 400, "non-empty"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, 400,
     "non-empty"),
    ({"temperature": 1.5}, 400, "temperature"),
    ({"top_k": -1}, 400, "top_k"),
    ({"service_tier": "gold"}, 400, "service_tier"),
    ({"metadata": {"user_id": 5}}, 400, "metadata"),
    ({"metadata": {"user": "u"}}, 400, "metadata"),
    ({"messages": TAGGED}, 400, "cache_control"),
    ({"tools": TOOLS, "messages": UNANSWERED}, 400, "toolu_1"),
    ({"messages": ANSWERED}, 400, "tools"),
])
def test_errors_come_in_anthropic_shape(server, change, status, field):
    body = {"model": MODEL_NAME, "max_tokens": 4, "messages": ASK, **change}
    r = httpx.post(server.url + "/v1/messages",
                   json={k: v for k, v in body.items() if v is not None}, timeout=30)
    print(r.status_code, r.text)
    assert r.status_code == status
    error = r.json()
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == ("not_found_error" if status == 404
                                      else "invalid_request_error")
    assert field in error["error"]["message"]


def test_the_sdk_raises_its_own_errors(claude):
    with pytest.raises(anthropic.NotFoundError) as raised:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=ASK)
    assert raised.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude.messages.create(model=MODEL_NAME, max_tokens=4, messages=ASK, tools=TOOLS,
                               tool_choice={"type": "tool", "name": "nope"})
    print(raised.value.body)
    assert raised.value.body["error"]["message"].startswith("tool_choice")


def test_no_effect_and_inert_fields_are_accepted(server):
    ask = [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                         "cache_control": {"type": "ephemeral"}}]}]
    body = {"model": "default", "max_tokens": 2, "messages": ask,
            "metadata": {"user_id": "u-1"}, "service_tier": "auto", "speed": "standard",
            "cache_control": {"type": "ephemeral"}, "thinking": {"type": "disabled"},
            "inference_geo": "eu", "workspace_id": "w", "user_profile_id": "p"}
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=30)
    print(r.text)
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] >= 1
    r = httpx.post(server.url + "/v1/messages", timeout=30,
                   json={**body, "container": "c-1"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("container")


def test_only_anthropic_routes_change_shape(server):
    r = httpx.post(server.url + "/v1/messages/nothing-here", json={}, timeout=10)
    assert r.status_code == 404 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/messages", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/messages/count_tokens", json={"messages": ASK}, timeout=10)
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "nope", "messages": ASK})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"  # OpenAI's envelope


# --- keys, 429 and 503, in-process over a fake engine ---------------------------------------


class BusyEngine(FakeEngine):
    def __init__(self, tokenizer, error: Exception) -> None:
        super().__init__(tokenizer)
        self.error = error

    def add_request(self, request) -> None:
        raise self.error


def test_x_api_key_guards_the_routes(tokenizer):
    app = create_app(FakeEngine(tokenizer), "m", AccessConfig(api_keys=("key-one",)))
    with TestClient(app) as http:
        good = anthropic.Anthropic(base_url="http://testserver", api_key="key-one",
                                   http_client=http, max_retries=0)
        assert good.messages.count_tokens(model="m", messages=ASK).input_tokens > 5
        assert http.get("/v1/models", headers={"x-api-key": "key-one"}).status_code == 200
        bad = anthropic.Anthropic(base_url="http://testserver", api_key="key-two",
                                  http_client=http, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as raised:
            bad.messages.create(model="m", max_tokens=4, messages=ASK)
        print(raised.value.body)
        assert raised.value.body == {"type": "error", "error": {
            "type": "authentication_error", "message": "Incorrect API key provided."}}
        r = http.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": ASK})
        assert r.status_code == 401 and "x-api-key" in r.json()["error"]["message"]
        r = http.get("/v1/models", headers={"x-api-key": "key-two"})  # OpenAI's envelope
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("error, status, err_type", [
    (QueueFullError("The waiting line is full", retry_after=3), 429, "rate_limit_error"),
    (EngineUnavailableError("The server is shutting down"), 503, "overloaded_error"),
])
def test_busy_and_unavailable_in_anthropic_shape(tokenizer, error, status, err_type):
    with TestClient(create_app(BusyEngine(tokenizer, error), "m")) as http:
        r = http.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": ASK})
    print(r.status_code, r.headers.get("retry-after"), r.text)
    assert r.status_code == status and r.json()["error"]["type"] == err_type
    assert (r.headers.get("retry-after") == "3") == (status == 429)


class TimingOutEngine(FakeEngine):
    """Ends every request with a passed deadline, as the engine reports one, after
    `tokens_first` outputs of one token each."""

    tokens_first = 0

    def add_request(self, request) -> None:
        for _ in range(self.tokens_first):
            request.on_output(RequestOutput(request.request_id, "Hi", [1]))
        request.on_output(RequestOutput(request.request_id, "", [], finished=True,
                                        finish_reason=FinishReason.TIMEOUT,
                                        error="The request's deadline passed."))


@pytest.mark.parametrize("tokens_first", [0, 1])
def test_errors_in_a_stream_are_error_events(tokenizer, tokens_first):
    body = {"model": "m", "max_tokens": 4, "messages": ASK}
    engine = TimingOutEngine(tokenizer)
    engine.tokens_first = tokens_first
    with TestClient(create_app(engine, "m")) as http:
        r = http.post("/v1/messages", json=body)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
        with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as stream:
            lines = [line for line in stream.iter_lines() if line]
    print(lines)
    names = [line.removeprefix("event: ") for line in lines[::2]]
    # message_start waits for the first output (its usage says what the prefix cache held),
    # so a request that fails before its first token sends the error alone.
    assert names == (["error"] if not tokens_first else
                     ["message_start", "content_block_start", "content_block_delta", "error"])
    assert json.loads(lines[-1].removeprefix("data: ")) == {"type": "error", "error": {
        "type": "timeout_error", "message": "The request's deadline passed."}}


def test_a_body_too_large_in_anthropic_shape(tokenizer):
    app = create_app(FakeEngine(tokenizer), "m", max_request_bytes=200)
    with TestClient(app) as http:
        r = http.post("/v1/messages", json={"model": "m", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "x" * 300}]})
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user",
                                                                  "content": "x" * 300}]})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


# --- the field policy covers Anthropic's request ---------------------------------------------


@pytest.mark.parametrize("sent_as", ["objects", "model_dump"])
def test_the_sdks_own_blocks_go_back_in_the_next_request(claude, sent_as):
    """The SDK's tool loop: the assistant's content appended as the response gave it (its
    block objects, or dumped: `caller` and `toolset_name` null on tool_use, `citations` null
    on text), then a tool_result for each call."""
    first = claude.messages.create(model=MODEL_NAME, max_tokens=80, messages=ASK, tools=TOOLS,
                                   tool_choice={"type": "any"}, extra_body=GREEDY)
    calls = check_tool_use(first)
    content = (first.content if sent_as == "objects"
               else [block.model_dump() for block in first.content])
    print("sent back:", content)
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "18 degrees, sunny"}
               for b in calls]
    history = [*ASK, {"role": "assistant", "content": content},
               {"role": "user", "content": results}]
    second = claude.messages.create(model=MODEL_NAME, max_tokens=8, messages=history,
                                    tools=TOOLS, extra_body=GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")


# The SDK's request types at each depth, and our model of each: every key the SDK can send
# must be a field of ours (a null one means absent; a value that changes the meaning is
# refused by the translation, naming it).
SDK_BLOCKS = [("TextBlockParam", "TextBlock"), ("ToolUseBlockParam", "ToolUseBlock"),
              ("ToolResultBlockParam", "ToolResultBlock"), ("ToolParam", "ToolDefinition"),
              ("CacheControlEphemeralParam", "CacheControl"),
              ("MetadataParam", "Metadata"), ("ToolChoiceAutoParam", "ToolChoiceAuto"),
              ("ToolChoiceAnyParam", "ToolChoiceAny"), ("ToolChoiceToolParam", "ToolChoiceTool"),
              ("ToolChoiceNoneParam", "ToolChoiceNone"), ("MessageParam", "InputMessage")]
# The response blocks a client sends back dumped: their keys too.
SDK_RESPONSE_BLOCKS = [("TextBlock", "TextBlock"), ("ToolUseBlock", "ToolUseBlock")]


@pytest.mark.parametrize("sdk_name, ours", SDK_BLOCKS + SDK_RESPONSE_BLOCKS)
def test_every_key_of_the_sdks_blocks_is_a_field(sdk_name, ours):
    from api.messages import protocol as protocol_messages

    sdk_type = getattr(anthropic.types, sdk_name)
    if hasattr(sdk_type, "model_fields"):  # a response block
        keys = set(sdk_type.model_fields)
    else:  # a request type, or a union of them (MessageParam)
        variants = typing.get_args(sdk_type) or (sdk_type,)
        keys = set().union(*(typing.get_type_hints(v) for v in variants))
    fields = set(getattr(protocol_messages, ours).model_fields)
    print(f"{sdk_name}: {sorted(keys)}")
    assert keys <= fields, sorted(keys - fields)


@pytest.mark.parametrize("block, refused", [
    ({"caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}},
     "code_execution_20250825"),
    ({"toolset_name": "browser"}, "browser"),
])
def test_a_call_made_by_code_execution_or_a_toolset_is_refused_by_name(server, block, refused):
    history = [*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
         "input": {"city": "Paris", "unit": "celsius"}, **block}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "18"}]}]
    r = httpx.post(server.url + "/v1/messages", json={
        "model": MODEL_NAME, "max_tokens": 4, "messages": history, "tools": TOOLS}, timeout=30)
    print(r.text)
    assert r.status_code == 400 and refused in r.json()["error"]["message"]


@pytest.mark.parametrize("endpoint, params, body", [
    (MESSAGES, message_create_params.MessageCreateParamsBase, MessagesRequest),
    # The beta surface (the tool runner's), but for betas, which the client sends as a header.
    (MESSAGES, beta_message_create_params.MessageCreateParamsBase, MessagesRequest),
    (COUNT_TOKENS, message_count_tokens_params.MessageCountTokensParams, CountTokensRequest),
])
def test_every_sdk_field_is_classified(endpoint, params, body):
    fields = set(typing.get_type_hints(params)) - {"betas"}
    if endpoint == MESSAGES:  # streaming, and the sampling fields older SDKs send
        fields |= {"stream", "temperature", "top_p", "top_k"}
    table = POLICIES[endpoint]
    assert not fields - set(table), sorted(fields - set(table))
    declared = set(body.model_fields)
    assert declared <= set(table), sorted(declared - set(table))
    for name, rule in table.items():
        assert rule.reason, name
        assert (rule.status is Status.IMPLEMENTED) <= (name in declared), name
        assert not (name in declared and rule.status is Status.REFUSED), name


@pytest.mark.parametrize("max_tokens", [6, 16, 30])
def test_a_call_cut_off_gives_the_same_blocks_streamed_or_not(claude, max_tokens):
    """Cut off inside the calls: tool_use blocks for the calls whose names came, with the
    input that parses so far, never the calls' markup as text; stop_reason max_tokens."""
    request = dict(model=MODEL_NAME, max_tokens=max_tokens, messages=ASK, tools=TOOLS,
                   tool_choice={"type": "any"}, extra_body=GREEDY)
    whole = claude.messages.create(**request)
    print(max_tokens, whole.stop_reason, whole.content)
    assert whole.stop_reason == "max_tokens"
    assert all(block.type == "tool_use" for block in whole.content)
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    assert [(b.name, b.input) for b in final.content] == \
        [(b.name, b.input) for b in whole.content]
    if max_tokens == 16:
        assert len(whole.content) == 1 and whole.content[0].name in SCHEMAS


def test_the_tool_runner_falls_back_from_a_thread_to_the_whole_conversation(claude, server):
    """The anthropic client's tool runner asks for a server-held thread by default: refused
    with the error code that makes it send the whole conversation, so its loop runs."""
    r = httpx.post(server.url + "/v1/messages", timeout=30, json={
        "model": MODEL_NAME, "max_tokens": 4, "messages": ASK, "thread": {"type": "create"}})
    print(r.text)
    assert r.status_code == 400
    assert r.json()["error"]["details"] == {"error_code": "thread_unsupported_request"}
    assert r.json()["error"]["message"].startswith("thread")
    calls = []

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """The weather now in a city."""
        calls.append(city)
        return "18 degrees, sunny"

    runner = claude.beta.messages.tool_runner(
        model=MODEL_NAME, max_tokens=60, messages=ASK, tools=[get_weather], max_iterations=2,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        extra_body=GREEDY)
    replies = list(runner)
    print([m.content for m in replies], calls)
    assert len(replies) == 2 and len(calls) >= 1  # a call, its result sent back, a second turn
    assert all(block.type == "tool_use" for block in replies[0].content)


def test_stream_options_is_only_checked_where_it_is_a_field():
    """Under --accept-unknown-fields, a stream_options sent to /v1/messages (which has no such
    field) is logged and ignored like any unknown field, not refused for want of stream."""
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": ASK,
                                           "stream_options": {"include_usage": True}})
    body.check_supported(accept_unknown=True)
    with pytest.raises(Exception, match="stream_options"):
        body.check_supported(accept_unknown=False)
