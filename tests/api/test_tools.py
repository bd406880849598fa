"""Function tools on /v1/chat/completions with the official client against a real server:
required and named choices give calls whose arguments validate, auto and none, streamed
calls reassemble to the non-streamed ones, a history with a tool result, and the 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from api.tools.calls import CallStream, scan
from tests.api.conftest import MODEL_NAME

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
               "required": ["zone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now "
                                      "in a city.", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time "
                                      "zone.", "parameters": TIME_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(choice, names=tuple(SCHEMAS)) -> None:
    """Only calls, to the allowed tools, with arguments that validate."""
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_required_and_named_choice_give_valid_calls(client: openai.OpenAI, temperature):
    r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                       tool_choice="required", temperature=temperature,
                                       seed=1, n=2, max_tokens=120)
    for choice in r.choices:
        print("required:", [(c.function.name, c.function.arguments)
                            for c in choice.message.tool_calls or []])
        check_calls(choice)
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                       tool_choice=named, temperature=temperature, seed=2,
                                       parallel_tool_calls=False, max_tokens=80, logprobs=True)
    choice = r.choices[0]
    print("named:", choice.message.tool_calls)
    check_calls(choice, ("get_time",))
    assert len(choice.message.tool_calls) == 1  # parallel_tool_calls false: one call
    # The logprobs are those of the call's tokens.
    assert "".join(t.token for t in choice.logprobs.content).startswith("<tool_call>")


def streamed_calls(client: openai.OpenAI, request: dict) -> tuple[list[tuple[str, str]], str]:
    """The request streamed: each call's name and joined arguments, and the finish_reason.
    No text comes; a call's first delta has its id, type and name, later ones neither."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            assert not choice.delta.content
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:
                    assert delta.id and delta.type == "function" and delta.function.name
                    calls[delta.index] = {"name": delta.function.name, "arguments": ""}
                else:
                    assert delta.id is None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments or ""
    return [(c["name"], c["arguments"]) for c in calls.values()], finish


def test_streamed_calls_reassemble_to_the_non_streamed(client: openai.OpenAI):
    request = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                   temperature=0, max_tokens=120)
    whole = client.chat.completions.create(**request).choices[0]
    check_calls(whole)
    calls, finish = streamed_calls(client, request)
    assert finish == "tool_calls"
    assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_auto_answers_text_or_valid_calls(client: openai.OpenAI):
    r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                       tool_choice="auto", temperature=1.0, seed=3, n=4,
                                       max_tokens=60)
    for choice in r.choices:
        print("auto:", choice.finish_reason, choice.message.content, choice.message.tool_calls)
        if choice.message.tool_calls:
            check_calls(choice)
        else:
            assert not choice.message.content.startswith("<")  # text cannot look like a call
            assert choice.finish_reason in ("stop", "length")


def test_none_never_calls(client: openai.OpenAI):
    r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                       tool_choice="none", temperature=0, max_tokens=30)
    choice = r.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    # No tools are rendered: the prompt is the one without them.
    plain = client.chat.completions.create(model=MODEL_NAME, messages=ASK, temperature=0,
                                           max_tokens=30)
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens
    assert choice.message.content == plain.choices[0].message.content


def test_history_with_a_tool_result(client: openai.OpenAI):
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function", "function": {
                       "name": "get_weather",
                       "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees, sunny"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS,
                                       tool_choice="none", temperature=0, max_tokens=40)
    print("after the result:", r.choices[0].message.content)
    assert r.choices[0].message.content
    without = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                             tool_choice="none", temperature=0, max_tokens=40)
    assert r.usage.prompt_tokens > without.usage.prompt_tokens + 10  # the call and result
    r = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS,
                                       tool_choice="required", temperature=0, max_tokens=120)
    check_calls(r.choices[0])


@pytest.mark.parametrize("sent_as", ["object", "model_dump"])
def test_the_sdks_own_message_goes_back_in_the_next_request(client: openai.OpenAI, sent_as):
    """The SDK's tool loop: the assistant's message appended as the response gave it (the
    object, or dumped with its null fields: refusal, audio, function_call, annotations),
    then a tool message for each call."""
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS,
                                           tool_choice="required", temperature=0,
                                           max_tokens=120)
    check_calls(first.choices[0])
    message = first.choices[0].message
    sent = message if sent_as == "object" else message.model_dump()
    print("sent back:", sent)
    results = [{"role": "tool", "tool_call_id": call.id, "content": "22 degrees, sunny"}
               for call in message.tool_calls]
    second = client.chat.completions.create(model=MODEL_NAME, messages=[*ASK, sent, *results],
                                            tools=TOOLS, temperature=0, max_tokens=8)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_legacy_functions(client: openai.OpenAI):
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, temperature=0, max_tokens=120,
        functions=[t["function"] for t in TOOLS], function_call={"name": "get_weather"})
    check_calls(r.choices[0], ("get_weather",))
    assert len(r.choices[0].message.tool_calls) == 1  # the legacy form: one call
    # The conversation goes on in the legacy form, and reads as it does in today's.
    call = r.choices[0].message.tool_calls[0].function
    legacy = [*ASK, {"role": "assistant", "content": None,
                     "function_call": {"name": call.name, "arguments": call.arguments}},
              {"role": "function", "name": call.name, "content": "22 degrees, sunny"}]
    today = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": call.name,
                                                          "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees, sunny"}]
    answers = [client.chat.completions.create(model=MODEL_NAME, messages=history, temperature=0,
                                              max_tokens=8, functions=[TOOLS[0]["function"]],
                                              function_call="none")
               for history in (legacy, today)]
    assert answers[0].usage.prompt_tokens == answers[1].usage.prompt_tokens
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    unanswered = [*ASK, {"role": "function", "name": "get_weather", "content": "22"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=unanswered, max_tokens=5)
    assert caught.value.body["param"] == "messages"
    assert "get_weather" in caught.value.body["message"]


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": 5}}}}}]},
     "tools"),  # a schema that does not compile
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object",
                                    "properties": {"x": {"type": "string",
                                                         "pattern": "(unclosed"}}}}}],
      "tool_choice": "required"}, "tools"),  # valid JSON schema, a regex llguidance refuses
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "functions": [TOOLS[0]["function"]]}, "functions"),
])
def test_bad_tool_requests_are_400s(client: openai.OpenAI, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=5,
                                       extra_body=extra)
    assert caught.value.body["param"] == param, caught.value.body


def test_tool_message_must_answer_an_earlier_call(client: openai.OpenAI):
    messages = [*ASK, {"role": "tool", "tool_call_id": "call_unknown", "content": "22"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS,
                                       max_tokens=5)
    assert caught.value.body["param"] == "messages"
    assert "call_unknown" in caught.value.body["message"]


def test_scan_and_stream_deltas_without_a_server():
    """The scanner reads cut-off text as far as it goes; deltas join into the arguments."""
    text = ('<tool_call>{"name":"get_weather","arguments":{"city":"a\\"}b","unit":"celsius"}}'
            '</tool_call>\n<tool_call>{"name":"get_time","arguments":{"zone":"UTC"}}'
            '</tool_call>')
    found = scan(text)
    assert found.complete and [c.name for c in found.calls] == ["get_weather", "get_time"]
    assert json.loads(found.calls[0].arguments) == {"city": 'a"}b', "unit": "celsius"}
    cut = scan(text[:60])
    assert cut.valid and not cut.complete and not cut.calls[0].complete
    assert not scan("<tool_call>{\"nope\"").valid
    stream, pieces = CallStream(), {}
    for end in range(1, len(text) + 1):
        for entry in stream.deltas(text[:end]):
            pieces[entry["index"]] = pieces.get(entry["index"], "") + \
                entry["function"]["arguments"]
    assert [pieces[0], pieces[1]] == [c.arguments for c in found.calls]


@pytest.mark.parametrize("max_tokens", [6, 16, 30])
def test_a_call_cut_off_reads_the_same_streamed_or_not(client: openai.OpenAI, max_tokens):
    """Cut off by max_tokens inside the calls: never the calls' markup as text; the calls
    whose names came, the last with the arguments that came, as the stream gives them."""
    request = dict(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                   temperature=0, max_tokens=max_tokens)
    whole = client.chat.completions.create(**request).choices[0]
    print(max_tokens, whole.finish_reason, repr(whole.message.content), whole.message.tool_calls)
    assert whole.finish_reason == "length"
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert whole.message.content == (None if calls else "")
    assert streamed_calls(client, request) == (calls, "length")
    if max_tokens == 16:  # inside the first call's arguments
        assert len(calls) == 1 and calls[0][0] in SCHEMAS and calls[0][1].startswith("{")
        # Sent back as it came (a client's history holds it), the cut call is read, not refused.
        history = [*ASK, whole.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": whole.message.tool_calls[0].id,
                    "content": "22 degrees"}]
        after = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS,
                                               tool_choice="none", max_tokens=4)
        assert after.choices[0].message.content is not None


def test_tokenize_counts_the_prompt_chat_runs(client: openai.OpenAI, server):
    """/tokenize with the tools and a history of calls counts what chat completions runs."""
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [{
                   "id": "call_1", "type": "function", "function": {
                       "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees, sunny"}]
    for choice in ("auto", "none", {"type": "function", "function": {"name": "get_time"}}):
        ran = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS,
                                             tool_choice=choice, max_tokens=1)
        counted = httpx.post(server.url + "/tokenize", timeout=30, json={
            "messages": history, "tools": TOOLS, "tool_choice": choice}).json()
        print(choice, ran.usage.prompt_tokens, counted["count"])
        assert counted["count"] == ran.usage.prompt_tokens
    bare = httpx.post(server.url + "/tokenize", timeout=30, json={"messages": history}).json()
    assert bare["count"] < counted["count"]  # the tools are in the prompt
    r = httpx.post(server.url + "/tokenize", timeout=30, json={"prompt": "Hi", "tools": TOOLS})
    print(r.text)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
