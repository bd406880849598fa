"""POST /v1/responses against a real server: the official client's responses.create and
.stream (text, item lists with instructions, function tools, structured output), every
body and stream event checked against OpenAI's published schema, openai-agents running a
tool-using agent over both the Responses and the chat model, and the 400s."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import Field

from api.answer import AnswerReader, ChatFormat
from api.field_policy import POLICIES, RESPONSES, Status
from api.responses.output import ResponseOutput
from api.responses.protocol import ResponsesRequest
from api.tools.formats import GENERIC
from tests.api.conftest import MODEL_NAME, RunningServer
from tests.api.test_field_policy import schema_properties
from tests.api.test_openapi_schema import OpenAISchemas, find_openapi_document
from tests.api.test_server import aborted_count, stats_when_idle
from tests.conftest import missing

CITY_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
               "required": ["city"], "additionalProperties": False}
ZONE_PARAMS = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
               "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": CITY_PARAMS, "strict": True},
         {"type": "function", "name": "get_time", "description": "The time in a time zone.",
          "parameters": ZONE_PARAMS, "strict": True}]
PARAMS = {"get_weather": CITY_PARAMS, "get_time": ZONE_PARAMS}
ASK = "What is the weather in Paris?"
TEXT_EVENTS = ["response.output_item.added", "response.content_part.added",
               "response.output_text.done", "response.content_part.done",
               "response.output_item.done"]


@pytest.fixture(scope="module")
def schemas() -> OpenAISchemas | None:
    """OpenAI's document, or None where it is missing (the schema checks are then skipped,
    the rest still runs); under CI=true, which has it, a missing document fails."""
    path = find_openapi_document()
    if path is None and os.environ.get("CI") == "true":
        missing("OpenAI's OpenAPI document (shared/openai-openapi.yaml)")
    return OpenAISchemas(path) if path is not None else None


def check(schemas: OpenAISchemas | None, name: str, instance: Any) -> None:
    if schemas is not None:
        schemas.check(name, instance)


def check_event(schemas: OpenAISchemas | None, event: dict) -> None:
    """An event against the one variant of ResponseStreamEvent of its type."""
    if schemas is None:
        return
    variants = [ref["$ref"].rsplit("/", 1)[-1]
                for ref in schemas.components["ResponseStreamEvent"]["anyOf"]]
    [name] = [v for v in variants
              if event["type"] in schemas.components[v]["properties"]["type"]["enum"]]
    schemas.check(name, event)


def create(server: RunningServer, **body: Any) -> dict:
    r = httpx.post(server.url + "/v1/responses",
                   json={"model": MODEL_NAME, "temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(server: RunningServer, **body: Any) -> list[dict]:
    """Every event of a streamed response, each checked to be named like its type."""
    events, name = [], None
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60, json={
            "model": MODEL_NAME, "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                event = json.loads(line.removeprefix("data:"))
                assert event["type"] == name, (name, event)
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def check_calls(items: list, names: tuple[str, ...] = tuple(PARAMS)) -> None:
    """Only function calls, to the allowed tools, with arguments that validate."""
    assert items
    for item in items:
        assert item.type == "function_call" and item.status == "completed", item
        assert item.call_id.startswith("call_") and item.name in names
        jsonschema.validate(json.loads(item.arguments), PARAMS[item.name])


# --- the official client -------------------------------------------------------------------


def test_string_input(client: openai.OpenAI, server: RunningServer, schemas):
    r = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=16,
                                temperature=0)
    print(r.status, repr(r.output_text), r.usage)
    assert r.object == "response" and r.status == "completed"
    assert r.id.startswith("resp_")
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert r.output_text and r.output_text == message.content[0].text
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    raw = create(server, input="Hi", max_output_tokens=16, metadata={"k": "v"})
    assert raw["output"][0]["content"][0]["text"] == r.output_text  # greedy: the same
    assert raw["metadata"] == {"k": "v"} and raw["completed_at"] is not None
    check(schemas, "Response", raw)


def test_cut_off_is_incomplete(server: RunningServer, schemas):
    raw = create(server, input="Count from 1 to 50.", max_output_tokens=3)
    print(raw["status"], raw["incomplete_details"], raw["output"])
    assert raw["status"] == "incomplete"
    assert raw["incomplete_details"] == {"reason": "max_output_tokens"}
    assert raw["output"][0]["status"] == "incomplete"
    assert raw["usage"]["output_tokens"] == 3
    check(schemas, "Response", raw)


def test_items_and_instructions_are_the_chat_messages(client: openai.OpenAI,
                                                      server: RunningServer):
    """The item list renders to exactly the prompt of the same chat messages."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello! How can I help?"}]},
             {"role": "developer", "content": "Be brief."},
             {"role": "user", "content": "Name a colour."}]
    r = client.responses.create(model=MODEL_NAME, input=items, instructions="You are kind.",
                                max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model=MODEL_NAME, max_tokens=12, temperature=0,
                                          messages=[
        {"role": "system", "content": "You are kind."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."}])
    print(r.usage.input_tokens, chat.usage.prompt_tokens, repr(r.output_text))
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content
    assert r.instructions == "You are kind."


def test_required_tool_gives_valid_calls(client: openai.OpenAI, server: RunningServer,
                                         schemas):
    r = client.responses.create(model=MODEL_NAME, input=ASK, tools=TOOLS,
                                tool_choice="required", max_output_tokens=120, temperature=0)
    print([(c.name, c.arguments) for c in r.output])
    assert r.status == "completed"
    check_calls(r.output)
    raw = create(server, input=ASK, tools=TOOLS, tool_choice="required",
                 max_output_tokens=120)
    assert [(c["name"], c["arguments"]) for c in raw["output"]] == [
        (c.name, c.arguments) for c in r.output]
    check(schemas, "Response", raw)


def test_named_tool_and_one_call(client: openai.OpenAI):
    r = client.responses.create(model=MODEL_NAME, input=ASK, tools=TOOLS, temperature=0.8,
                                tool_choice={"type": "function", "name": "get_time"},
                                parallel_tool_calls=False, max_output_tokens=80)
    print([(c.name, c.arguments) for c in r.output])
    check_calls(r.output, ("get_time",))
    assert len(r.output) == 1


def test_history_with_a_call_and_its_output(client: openai.OpenAI):
    """A function_call and its output in input: answered under tool_choice none as text."""
    items = [{"role": "user", "content": ASK},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city":"Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}]
    r = client.responses.create(model=MODEL_NAME, input=items, tools=TOOLS,
                                tool_choice="none", max_output_tokens=16, temperature=0)
    print(repr(r.output_text))
    assert [item.type for item in r.output] == ["message"]


@pytest.mark.parametrize("sent_as", ["objects", "model_dump"])
def test_the_sdks_own_output_goes_back_in_the_next_request(client: openai.OpenAI, sent_as):
    """The SDK's tool loop: `input += response.output` (the item objects, or dumped with
    their ids and statuses), then a function_call_output for each call."""
    items: list[Any] = [{"role": "user", "content": ASK}]
    first = client.responses.create(model=MODEL_NAME, input=items, tools=TOOLS,
                                    tool_choice="required", max_output_tokens=120,
                                    temperature=0)
    check_calls(first.output)
    items += (first.output if sent_as == "objects"
              else [item.model_dump() for item in first.output])
    items += [{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
              for call in first.output]
    print("sent back:", items)
    second = client.responses.create(model=MODEL_NAME, input=items, tools=TOOLS,
                                     max_output_tokens=8, temperature=0)
    assert second.status in ("completed", "incomplete")


def test_json_schema_output(client: openai.OpenAI, server: RunningServer, schemas):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}
    r = client.responses.create(model=MODEL_NAME, input="Name a colour, as JSON.",
                                text={"format": fmt}, max_output_tokens=40, temperature=0.7)
    print(repr(r.output_text))
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.schema_ == schema  # the SDK's name for it (BaseModel has .schema())
    raw = create(server, input="Name a colour, as JSON.", text={"format": fmt},
                 max_output_tokens=40, temperature=0.7)
    assert raw["text"]["format"] == fmt  # echoed as sent: "schema", never "schema_"
    check(schemas, "Response", raw)
    raw = create(server, input="Name a colour.", text={"format": {"type": "json_object"}},
                 max_output_tokens=40)
    assert isinstance(json.loads(raw["output"][0]["content"][0]["text"]), dict)
    assert raw["text"]["format"] == {"type": "json_object"}
    check(schemas, "Response", raw)


# --- streams -------------------------------------------------------------------------------


def test_text_stream_events(client: openai.OpenAI, server: RunningServer, schemas):
    events = stream_events(server, input="Hi", max_output_tokens=16,
                           stream_options={"include_obfuscation": False})  # no padding anyway
    types = [e["type"] for e in events]
    print(types)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas
    assert types == ["response.created", "response.in_progress", *TEXT_EVENTS[:2],
                     *["response.output_text.delta"] * len(deltas), *TEXT_EVENTS[2:],
                     "response.completed"]
    final = events[-1]["response"]
    text = final["output"][0]["content"][0]["text"]
    assert "".join(deltas) == text == events[-4]["text"]
    assert events[0]["response"]["status"] == "in_progress" and final["status"] == "completed"
    assert text == create(server, input="Hi", max_output_tokens=16)["output"][0][
        "content"][0]["text"]
    for event in events:
        check_event(schemas, event)
    # The client's own stream helper reads the same events into the same response.
    with client.responses.stream(model=MODEL_NAME, input="Hi", max_output_tokens=16,
                                 temperature=0) as sdk_stream:
        sdk_deltas = [e.delta for e in sdk_stream if e.type == "response.output_text.delta"]
        assert sdk_stream.get_final_response().output_text == "".join(sdk_deltas) == text


def test_call_stream_events(server: RunningServer, schemas):
    body = {"input": ASK, "tools": TOOLS, "tool_choice": "required", "max_output_tokens": 120}
    events = stream_events(server, **body)
    print([e["type"] for e in events])
    final = events[-1]
    assert final["type"] == "response.completed"
    calls = final["response"]["output"]
    assert calls and all(c["type"] == "function_call" for c in calls)
    for index, call in enumerate(calls):
        mine = [e for e in events if e.get("output_index") == index]
        assert [e["type"] for e in mine[:1] + mine[-2:]] == [
            "response.output_item.added", "response.function_call_arguments.done",
            "response.output_item.done"]
        pieces = [e["delta"] for e in mine
                  if e["type"] == "response.function_call_arguments.delta"]
        assert "".join(pieces) == mine[-2]["arguments"] == call["arguments"]
        assert mine[-1]["item"] == call
    plain = create(server, **body)["output"]
    assert [(c["name"], c["arguments"]) for c in plain] == [
        (c["name"], c["arguments"]) for c in calls]
    for event in events:
        check_event(schemas, event)


def test_deadline_mid_stream_is_an_error_event(server: RunningServer, schemas):
    events = stream_events(server, input="Count from 1 to 500.", max_output_tokens=400,
                           request_timeout=0.2)
    print([e["type"] for e in events][:3], events[-1])
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "error" and events[-1]["code"] == "request_timeout"
    assert not any(e["type"] == "response.completed" for e in events)
    check_event(schemas, events[-1])


def test_disconnect_aborts_the_request(server: RunningServer):
    assert stats_when_idle(server)["blocks_used"] == 0
    aborted = aborted_count(server)
    body = {"input": "Tell me a long story.", "max_output_tokens": 300, "stream": True,
            "temperature": 0}  # greedy: a story far longer than the time to notice
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + "/v1/responses",
                                                  json=body) as r:
        deltas = (line for line in r.iter_lines() if "output_text.delta" in line)
        next(deltas)
        next(deltas)  # generating
    after = stats_when_idle(server)
    print(after)
    assert after["running"] == 0 and after["blocks_used"] == 0
    assert aborted_count(server) == aborted + 1


def test_output_walk_without_a_server():
    """Text split anywhere gives the same items as the whole text at once."""
    text = ('<tool_call>{"name":"f","arguments":{"a":"x}"}}</tool_call>\n'
            '<tool_call>{"name":"g","arguments":{}}</tool_call>')
    reader = AnswerReader(ChatFormat(), may_call=True, thinking="free")
    whole = ResponseOutput(GENERIC)
    whole.advance(reader.read(text, True), finished=True)
    pieces = ResponseOutput(GENERIC)
    events = [e for i in range(1, len(text) + 1)
              for e in pieces.advance(reader.read(text[:i], i == len(text)),
                                      finished=i == len(text))]
    assert [(c.name, c.arguments) for c in whole.items] == [("f", '{"a":"x}"}'), ("g", "{}")]
    assert [c.model_dump(exclude={"id", "call_id"}) for c in pieces.items] == [
        c.model_dump(exclude={"id", "call_id"}) for c in whole.items]
    assert sum(e.type == "response.output_item.done" for e in events) == 2
    text_only = AnswerReader(ChatFormat(), may_call=False, thinking="free")
    assert ResponseOutput(GENERIC).advance(text_only.read("<b>", True),
                                           finished=True)[0].item.type == "message"


def test_openapi_documents_the_route(server: RunningServer):
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    route = doc["paths"]["/v1/responses"]["post"]
    ok = route["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ResponseObject"}
    item = ok["text/event-stream"]["itemSchema"]
    assert item["required"] == ["event", "data"]
    named = {branch["contentSchema"]["$ref"].rsplit("/", 1)[-1]
             for branch in item["properties"]["data"]["anyOf"]}
    print(sorted(named))
    assert {"TextDeltaEvent", "ArgumentsDeltaEvent", "ErrorEvent"} <= named
    assert named <= set(doc["components"]["schemas"])
    assert {"400", "404", "429", "504"} <= set(route["responses"])


# --- openai-agents -------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_agent_runs_a_tool_to_completion(server: RunningServer, api: str):
    try:
        import agents
    except ImportError:
        missing("the OpenAI Agents SDK (openai-agents, in requirements-dev.txt)")
    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: Annotated[str, Field(max_length=16)]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"Sunny in {city}."

    def stop_at_second_call(_context, results) -> agents.ToolsToFinalOutputResult:
        # Every turn must call (a free answer from this small model may run past any short
        # limit): the second turn, whose input holds the first call and its output, ends
        # the run with its call's result.
        return agents.ToolsToFinalOutputResult(is_final_output=len(seen) >= 2,
                                               final_output=results[-1].output)

    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    model_class = (agents.OpenAIResponsesModel if api == "responses"
                   else agents.OpenAIChatCompletionsModel)
    agent = agents.Agent(
        name="weather", instructions="Answer with the tool's help.", tools=[get_weather],
        model=model_class(model=MODEL_NAME, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                            temperature=0, max_tokens=60),
        tool_use_behavior=stop_at_second_call, reset_tool_choice=False)
    result = agents.Runner.run_sync(agent, ASK, max_turns=3)
    print(api, seen, repr(result.final_output))
    assert len(seen) == 2 and all(0 < len(city) <= 16 for city in seen)
    assert result.final_output == f"Sunny in {seen[-1]}."
    assert len(result.raw_responses) == 2


# --- bad requests --------------------------------------------------------------------------


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}}],
      "tool_choice": "required"}, "tools"),  # valid JSON schema, a regex llguidance refuses
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}]}, "tools"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": [{"role": "user", "content": ASK}, {"type": "function_call_output",
                                                   "call_id": "call_x", "output": "1"}]},
     "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": []}, "input"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "text.format"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
     "text.format"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),  # needs stream
    ({"stream": True, "stream_options": {"include_obfuscation": "no"}},
     "stream_options.include_obfuscation"),
])
def test_bad_requests_are_400s(server: RunningServer, schemas, extra, param):
    r = httpx.post(server.url + "/v1/responses", timeout=30,
                   json={"model": MODEL_NAME, "input": ASK, "max_output_tokens": 5, **extra})
    print(r.status_code, r.text)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    check(schemas, "ErrorResponse", r.json())


def test_the_client_sees_a_bad_request(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_NAME, input=ASK, previous_response_id="resp_1")
    assert caught.value.body["param"] == "previous_response_id"
    assert "stateless" in caught.value.body["message"]


# --- the field policy ----------------------------------------------------------------------


def test_every_field_is_classified(schemas):
    if schemas is None:
        missing("OpenAI's OpenAPI document (shared/openai-openapi.yaml)")
    properties = schema_properties(schemas.components, "CreateResponse")
    assert len(properties) > 25  # the walk through allOf found the schema's fields
    unclassified = properties - set(POLICIES[RESPONSES])
    assert not unclassified, f"fields with no policy: {sorted(unclassified)}"


def test_table_agrees_with_the_request_body():
    """A declared field is read; an implemented one is declared; every rule says why."""
    declared, table = set(ResponsesRequest.model_fields), POLICIES[RESPONSES]
    assert declared <= set(table), sorted(declared - set(table))
    for name, rule in table.items():
        assert rule.reason, name
        assert (rule.status is Status.IMPLEMENTED) <= (name in declared), name
        assert not (name in declared and rule.status is Status.REFUSED), name


@pytest.mark.parametrize("field, value", [
    ("store", True), ("store", False), ("user", "someone"), ("service_tier", "auto"),
    ("include", []), ("truncation", "disabled"), ("top_logprobs", 0),
    ("text", {"verbosity": "low"}),
    ("prompt_cache_key", "k"), ("max_tool_calls", 3), ("reasoning", None),
    ("reasoning", {"effort": "low", "summary": "auto"})])  # a model that does not think
def test_no_effect_and_inert_fields_are_accepted(server: RunningServer, field, value):
    raw = create(server, input="Hi", max_output_tokens=2, **{field: value})
    assert raw["usage"]["output_tokens"] >= 1


@pytest.mark.parametrize("field, value", [
    ("background", True), ("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"}),
    ("truncation", "auto"), ("top_logprobs", 2),
    ("context_management", [{"type": "compaction"}])])
def test_refused_fields_name_themselves(server: RunningServer, field, value):
    r = httpx.post(server.url + "/v1/responses", timeout=30,
                   json={"input": "Hi", "max_output_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]
