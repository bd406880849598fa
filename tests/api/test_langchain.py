"""LangChain's OpenAI chat model against a real server (through /v1/chat/completions): tools
bound from a pydantic model and from a @tool function, chosen by name or as "any", give an
AIMessage whose tool_calls' args validate."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.api.conftest import MODEL_NAME


class GetWeather(BaseModel):
    """The weather now in a city."""

    city: str = Field(max_length=20, description="The city's name")


@tool
def get_time(zone: str) -> str:
    """The time now in a time zone."""
    return "12:00"


@pytest.mark.parametrize("tool_choice, names", [
    ("GetWeather", {"GetWeather"}),
    ("any", {"GetWeather", "get_time"}),
])
def test_bound_tools_give_tool_calls_that_validate(server, tool_choice, names):
    chat = ChatOpenAI(base_url=server.url + "/v1", api_key="x", model=MODEL_NAME,
                      temperature=0, max_tokens=60, max_retries=0, timeout=60)
    # strict: the schemas forbid other properties, so the grammar leaves the model no room to
    # invent some; one call, so that a small model cannot repeat calls until max_tokens.
    bound = chat.bind_tools([GetWeather, get_time], tool_choice=tool_choice, strict=True,
                            parallel_tool_calls=False)
    answer = bound.invoke("What is the weather in Paris?")
    print(answer.tool_calls)
    assert isinstance(answer, AIMessage) and answer.tool_calls
    assert not answer.invalid_tool_calls
    for call in answer.tool_calls:
        assert call["name"] in names and call["id"]
        if call["name"] == "GetWeather":
            GetWeather.model_validate(call["args"])
        else:
            assert get_time.args_schema.model_validate(call["args"]).zone
    assert len(answer.tool_calls) == 1
    assert answer.response_metadata["finish_reason"] == "tool_calls"
