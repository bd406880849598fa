"""chat_template_kwargs: a request's own variables for the chat template, on chat
completions and /tokenize alike."""

from __future__ import annotations

import copy

import httpx
import pytest

from api.errors import APIError
from api.openai.protocol import ChatMessage
from api.tokenization import chat_prompt

THINKING = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>"
            "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"
            "{% endif %}")
HI = [{"role": "user", "content": "Hi"}]


def test_a_template_variable_reaches_the_template(tokenizer):
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING
    messages = [ChatMessage(role="user", content="Hi")]
    plain = chat_prompt(thinking, messages, None)
    off = chat_prompt(thinking, messages, None, variables={"enable_thinking": False})
    on = chat_prompt(thinking, messages, None, variables={"enable_thinking": True})
    print(plain, off, on, sep="\n")
    assert off == plain + "<no-think>" and on == plain
    assert chat_prompt(thinking, messages, None, variables={"unused": 3}) == plain


def tokenize(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/tokenize", json={"messages": HI, **body}, timeout=30)


def test_a_variable_the_template_does_not_use_changes_nothing(server):
    plain = tokenize(server).json()
    with_variable = tokenize(server, chat_template_kwargs={"enable_thinking": False})
    assert with_variable.status_code == 200, with_variable.text
    assert with_variable.json()["tokens"] == plain["tokens"]
    chat = {"messages": HI, "max_tokens": 4, "temperature": 0}
    answers = [httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                          json={**chat, **extra}).json()
               for extra in ({}, {"chat_template_kwargs": {"enable_thinking": False}})]
    assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
    counts = [{k: v for k, v in a["usage"].items() if k.endswith("_tokens")} for a in answers]
    assert counts[0] == counts[1]  # (the second finds the first's prompt in the prefix cache)


@pytest.mark.parametrize("variables, says", [
    ({"tools": []}, "set by the server"),
    ({"add_generation_prompt": False}, "set by the server"),
    ({"not a name": 1}, "not a template variable"),
])
def test_what_the_server_sets_itself_is_a_400(server, variables, says):
    for reply in (tokenize(server, chat_template_kwargs=variables),
                  httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                             json={"messages": HI, "chat_template_kwargs": variables})):
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "chat_template_kwargs" and says in error["message"]


def test_the_check_names_the_field():
    from api.openai.protocol import ChatCompletionRequest

    body = ChatCompletionRequest(messages=HI, chat_template_kwargs={"messages": []})
    with pytest.raises(APIError, match="chat_template_kwargs"):
        body.template_variables()
