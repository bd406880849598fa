"""The OpenAI-compatible server over real HTTP on loopback (fixtures in conftest.py).

Every generation is short and, unless a test is about sampling, greedy, so texts can be
compared exactly: streamed against non-streamed, over HTTP against Hugging Face, with a
stop condition against without one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.live_server import DONE, sse_events
from tests.api.conftest import MODEL_NAME, RunningServer

PROMPT = "The cat sat on the"
CHAT_HI = [{"role": "user", "content": "Hi"}]  # greedy: a short reply, then end-of-sequence
ERROR_KEYS = {"message", "type", "param", "code"}


# --- helpers ---------------------------------------------------------------------------------


def post(server: RunningServer, path: str, body: dict[str, Any], timeout: float = 60) -> dict:
    """A non-streaming request that must succeed; returns the JSON body."""
    r = httpx.post(server.url + path, json=body, timeout=timeout)
    assert r.status_code == 200, f"{path} {body} -> {r.status_code} {r.text}"
    return r.json()


def complete(server: RunningServer, **body: Any) -> dict:
    return post(server, "/v1/completions", {"model": MODEL_NAME, "temperature": 0, **body})


def chat(server: RunningServer, **body: Any) -> dict:
    return post(server, "/v1/chat/completions", {"model": MODEL_NAME, "temperature": 0, **body})


def stream(server: RunningServer, path: str, body: dict[str, Any]) -> list[dict]:
    """The JSON events of a streamed response, checking it is SSE and ends in [DONE]."""
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events, "no events"
    assert events[-1] == DONE, f"last event: {events[-1]!r}"
    assert DONE not in events[:-1]
    return events[:-1]


def stats_when_idle(server: RunningServer, within: float = 6.0) -> dict[str, int]:
    """engine.stats() once nothing runs, waits or holds a block (or the last one seen)."""
    deadline = time.monotonic() + within
    while True:
        stats = server.engine.stats()
        idle = stats["running"] == 0 and stats["waiting"] == 0 and stats["blocks_used"] == 0
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def scrape(server: RunningServer) -> dict[str, float]:
    """/metrics as {sample name with labels: value}."""
    r = httpx.get(server.url + "/metrics", timeout=10)
    assert r.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def aborted_count(server: RunningServer) -> float:
    return scrape(server).get('nano_vllm:request_success_total{finished_reason="abort"}', 0.0)


def check_error(r: httpx.Response, status: int = 400, err_type: str = "invalid_request_error",
                param: str | None = None) -> dict:
    """The OpenAI error envelope with a readable message; returns the inner error."""
    assert r.status_code == status, f"{r.status_code} {r.text}"
    body = r.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == ERROR_KEYS, error
    assert error["type"] == err_type
    assert isinstance(error["message"], str) and len(error["message"]) > 5, error
    assert error["param"] == param, f"param {error['param']!r}, expected {param!r}"
    return error


def hf_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face's greedy continuation (it stops after an end-of-sequence token)."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(
            1, len(prompt_ids), dtype=torch.long), do_sample=False,
            max_new_tokens=max_new_tokens, pad_token_id=hf_model.config.eos_token_id)
    return out[0, len(prompt_ids):].tolist()


# --- basics ----------------------------------------------------------------------------------


def test_health_models_and_unknown_route(server):
    health = httpx.get(server.url + "/health").json()
    print("health:", health)
    assert health == {"status": "ok"}

    models = httpx.get(server.url + "/v1/models").json()
    print("models:", models)
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]
    assert models["data"][0]["object"] == "model"
    assert models["data"][0]["max_model_len"] == server.engine.max_tokens_per_request

    error = check_error(httpx.get(server.url + "/v1/nothing"), 404, "not_found_error")
    print("unknown route:", error)


def test_completion_shape(server, tokenizer):
    body = complete(server, prompt=PROMPT, max_tokens=8)
    print("completion:", body)
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == MODEL_NAME
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str) and choice["text"]
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(tokenizer(PROMPT).input_ids)
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_completion_streaming_equals_non_streaming(server):
    request = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
               "ignore_eos": True}
    whole = complete(server, **request)
    events = stream(server, "/v1/completions",
                    {**request, "stream_options": {"include_usage": True}})
    *token_events, usage_event = events
    streamed = "".join(e["choices"][0]["text"] for e in token_events)
    print(f"non-streamed {whole['choices'][0]['text']!r}\nstreamed     {streamed!r}")
    print(f"{len(token_events)} token events, usage {usage_event['usage']}")

    assert streamed == whole["choices"][0]["text"]
    assert len(token_events) == 12  # one event per token
    for e in token_events:
        assert e["object"] == "text_completion"
        assert e["id"] == token_events[0]["id"]
        assert e["model"] == MODEL_NAME
    assert all(e["choices"][0]["finish_reason"] is None for e in token_events[:-1])
    assert token_events[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_event["choices"] == []
    assert usage_event["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] == 12
    assert whole["choices"][0]["finish_reason"] == "length"


def test_streaming_without_include_usage_has_no_usage_event(server):
    events = stream(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3,
                                                "temperature": 0, "ignore_eos": True})
    print("events:", [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in events])
    assert len(events) == 3
    assert all("usage" not in e or e["usage"] is None for e in events)


def test_chat_streaming_equals_non_streaming(server):
    whole = chat(server, messages=CHAT_HI, max_tokens=16)
    print("chat:", whole)
    assert whole["object"] == "chat.completion"
    assert whole["id"].startswith("chatcmpl-")
    [choice] = whole["choices"]
    assert choice["message"]["role"] == "assistant"
    reply = choice["message"]["content"]
    assert reply and "<|im_end|>" not in reply
    assert choice["finish_reason"] == "stop"  # the model ends its short greeting itself
    assert whole["usage"]["completion_tokens"] < 16

    events = stream(server, "/v1/chat/completions",
                    {"messages": CHAT_HI, "max_tokens": 16, "temperature": 0,
                     "stream_options": {"include_usage": True}})
    first, *token_events, usage_event = events
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in token_events)
    print(f"non-streamed {reply!r}\nstreamed     {streamed!r}")
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert streamed == reply
    assert len(token_events) == whole["usage"]["completion_tokens"]  # one chunk per token
    assert all("text" not in e["choices"][0] for e in token_events)
    assert token_events[-1]["choices"][0]["finish_reason"] == "stop"
    # The same counts; the streamed request may find the first one's prompt blocks cached.
    streamed_usage, whole_usage = dict(usage_event["usage"]), dict(whole["usage"])
    streamed_cached = streamed_usage.pop("prompt_tokens_details")["cached_tokens"]
    assert streamed_cached >= whole_usage.pop("prompt_tokens_details")["cached_tokens"]
    assert streamed_usage == whole_usage


def test_prompt_as_token_ids(server, tokenizer):
    ids = tokenizer(PROMPT).input_ids
    by_text = complete(server, prompt=PROMPT, max_tokens=8)
    by_ids = complete(server, prompt=ids, max_tokens=8)
    print(f"ids {ids}: {by_ids['choices'][0]['text']!r} vs text: {by_text['choices'][0]['text']!r}")
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("prompt", [PROMPT, "def fibonacci(n):\n    if n < 2:\n        return"])
def test_greedy_equals_hugging_face(server, hf_model, tokenizer, prompt):
    ids = tokenizer(prompt).input_ids
    ours = complete(server, prompt=ids, max_tokens=12)
    theirs = hf_greedy(hf_model, ids, 12)
    expected = tokenizer.decode(theirs, skip_special_tokens=True)
    print(f"HTTP {ours['choices'][0]['text']!r}\nHF   {expected!r} ({len(theirs)} tokens)")
    assert ours["choices"][0]["text"] == expected
    assert ours["usage"]["completion_tokens"] == len(theirs)


# --- stop conditions -------------------------------------------------------------------------


def test_stop_string(server):
    request = {"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True}
    greedy = complete(server, **request)["choices"][0]["text"]
    words = greedy.split()
    stop = next(w for w in words[len(words) // 2:] if len(w) >= 5)  # likely over 2+ tokens
    cut = greedy.find(stop)
    assert cut > 0, (greedy, stop)
    expected = greedy[:cut]
    print(f"greedy {greedy!r}\nstop at {stop!r} -> expect {expected!r}")

    stopped = complete(server, **request, stop=[stop])
    text = stopped["choices"][0]["text"]
    print(f"got    {text!r} ({stopped['usage']['completion_tokens']} tokens)")
    assert text == expected
    assert stop not in text
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] < 16

    events = stream(server, "/v1/completions",
                    {**request, "temperature": 0, "stop": stop})  # a lone string works too
    streamed = "".join(e["choices"][0]["text"] for e in events)
    print(f"stream {streamed!r}")
    assert streamed == expected
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(events) == stopped["usage"]["completion_tokens"]


def test_stop_token_ids_and_min_tokens(server, hf_model, tokenizer):
    ids = tokenizer(PROMPT).input_ids
    greedy = hf_greedy(hf_model, ids, 16)
    stop_id = greedy[2]
    first = greedy.index(stop_id)
    print(f"greedy ids {greedy}; stop token {stop_id} ({tokenizer.decode([stop_id])!r}) "
          f"first at {first}")

    stopped = complete(server, prompt=ids, max_tokens=16, stop_token_ids=[stop_id])
    print("stop_token_ids:", stopped["choices"][0], stopped["usage"])
    assert stopped["choices"][0]["text"] == tokenizer.decode(greedy[:first])
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == first + 1  # the stop token counts

    # With min_tokens past that point the first occurrence does not stop it: a stop token ends
    # the request only once min_tokens tokens came before it.
    min_tokens = first + 2
    later = [i for i in range(min_tokens, len(greedy)) if greedy[i] == stop_id]
    held = complete(server, prompt=ids, max_tokens=16, stop_token_ids=[stop_id],
                    min_tokens=min_tokens)
    print(f"min_tokens={min_tokens}:", held["choices"][0], held["usage"])
    end = later[0] if later else len(greedy)
    assert held["choices"][0]["text"] == tokenizer.decode(greedy[:end])
    assert held["choices"][0]["finish_reason"] == ("stop" if later else "length")
    assert held["usage"]["completion_tokens"] == (end + 1 if later else len(greedy))
    assert held["usage"]["completion_tokens"] > min_tokens


def test_ignore_eos_and_min_tokens_hold_off_the_end(server):
    natural = chat(server, messages=CHAT_HI, max_tokens=16)
    n = natural["usage"]["completion_tokens"]
    print(f"natural: {natural['choices'][0]['finish_reason']} after {n} tokens")
    assert natural["choices"][0]["finish_reason"] == "stop" and n < 14

    ignoring = chat(server, messages=CHAT_HI, max_tokens=16, ignore_eos=True)
    print("ignore_eos:", ignoring["choices"][0]["finish_reason"], ignoring["usage"])
    assert ignoring["choices"][0]["finish_reason"] == "length"
    assert ignoring["usage"]["completion_tokens"] == 16
    assert ignoring["choices"][0]["message"]["content"].startswith(
        natural["choices"][0]["message"]["content"])

    held = chat(server, messages=CHAT_HI, max_tokens=16, min_tokens=14)
    print("min_tokens=14:", held["choices"][0]["finish_reason"], held["usage"])
    assert held["usage"]["completion_tokens"] >= 14


def test_tiny_temperature_is_greedy(server):
    greedy = complete(server, prompt=PROMPT, max_tokens=6)["choices"][0]["text"]
    tiny = complete(server, prompt=PROMPT, max_tokens=6, temperature=1e-40)
    print(f"temperature 0: {greedy!r}, 1e-40: {tiny['choices'][0]['text']!r}")
    assert tiny["choices"][0]["text"] == greedy


def test_seed_reproducibility(server):
    request = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9,
               "ignore_eos": True}
    a = complete(server, **request, seed=1234)["choices"][0]["text"]
    b = complete(server, **request, seed=1234)["choices"][0]["text"]
    print(f"seed 1234 twice: {a!r} / {b!r}")
    assert a == b
    others = []
    for seed in (1, 2, 3):
        others.append(complete(server, **request, seed=seed)["choices"][0]["text"])
        print(f"seed {seed}: {others[-1]!r}")
        if others[-1] != a:
            break
    assert any(o != a for o in others)


# --- the official client ---------------------------------------------------------------------


def test_openai_client_completions(server, client):
    raw = complete(server, prompt=PROMPT, max_tokens=8)["choices"][0]["text"]
    resp = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8,
                                     temperature=0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    print(f"httpx {raw!r}\nopenai {resp.choices[0].text!r}\nopenai stream {streamed!r}")
    assert resp.choices[0].text == raw == streamed
    assert resp.usage.completion_tokens == chunks[-1].usage.completion_tokens
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_openai_client_chat(client):
    resp = client.chat.completions.create(model=MODEL_NAME, messages=CHAT_HI, max_tokens=16,
                                          temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT_HI,
                                                 max_tokens=16, temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    print(f"openai chat {resp.choices[0].message.content!r}\nstreamed    {streamed!r}")
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == streamed
    assert resp.choices[0].finish_reason == "stop" == chunks[-1].choices[0].finish_reason

    long = client.chat.completions.create(model=MODEL_NAME, messages=CHAT_HI, max_tokens=16,
                                          temperature=0, extra_body={"ignore_eos": True})
    print("ignore_eos via extra_body:", long.usage)
    assert long.usage.completion_tokens == 16


def test_openai_client_models_and_errors(client):
    ids = [m.id for m in client.models.list()]
    print("models:", ids)
    assert ids == [MODEL_NAME]
    for name in (MODEL_NAME, "default"):
        assert client.models.retrieve(name).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=0)
    print("max_tokens=0:", info.value.body)
    assert info.value.status_code == 400
    assert "max_tokens" in info.value.body["message"]
    assert info.value.body["param"] == "max_tokens"


# --- bad requests ----------------------------------------------------------------------------

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
GOOD = {"prompt": "Hi", "max_tokens": 2}
GOOD_CHAT = {"messages": CHAT_HI, "max_tokens": 2}
BAD_REQUESTS = [
    # (name, path, body, expected param); body: a dict sent as JSON, raw bytes sent as
    # application/json, or {"content": ..., "headers": ...} sent as they are
    ("malformed JSON", COMPLETIONS, b'{"prompt": "Hi", "max_tokens": ', None),
    ("body not an object", COMPLETIONS, b'["Hi"]', None),
    ("JSON without its content type", COMPLETIONS,
     {"content": b'{"prompt": "Hi"}', "headers": {"content-type": "text/plain"}}, None),
    ("no prompt", COMPLETIONS, {"max_tokens": 2}, "prompt"),
    ("max_tokens a string", COMPLETIONS, {**GOOD, "max_tokens": "5"}, "max_tokens"),
    ("temperature a string", COMPLETIONS, {**GOOD, "temperature": "hot"}, "temperature"),
    ("prompt a number", COMPLETIONS, {"prompt": 5}, "prompt"),
    ("messages not a list", CHAT, {"messages": "Hi"}, "messages"),
    ("message content a number", CHAT, {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content"),
    ("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "Hi"}]},
     "messages.0.role"),
    ("empty prompt", COMPLETIONS, {**GOOD, "prompt": ""}, "prompt"),
    ("empty token list", COMPLETIONS, {**GOOD, "prompt": []}, "prompt"),
    ("token id out of vocab", COMPLETIONS, {**GOOD, "prompt": [1, 10**6]}, "prompt"),
    ("max_tokens 0", COMPLETIONS, {**GOOD, "max_tokens": 0}, "max_tokens"),
    ("max_tokens -1", COMPLETIONS, {**GOOD, "max_tokens": -1}, "max_tokens"),
    ("max_tokens 0 (chat)", CHAT, {**GOOD_CHAT, "max_tokens": 0}, "max_tokens"),
    ("max_completion_tokens 0", CHAT, {**GOOD_CHAT, "max_completion_tokens": 0},
     "max_completion_tokens"),
    ("a message that is a string", CHAT, {"messages": ["Hi"]}, "messages.0"),
    ("stream_options without stream", CHAT,
     {**GOOD_CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ("an image part", CHAT, {**GOOD_CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]},
     "messages.0.content.0"),
    ("a chat past the context", CHAT, {**GOOD_CHAT, "messages": [
        {"role": "user", "content": "word " * 9000}]}, "messages"),
    ("beyond the context", COMPLETIONS, {**GOOD, "max_tokens": 100000}, "max_tokens"),
    ("temperature -1", COMPLETIONS, {**GOOD, "temperature": -1}, "temperature"),
    ("temperature NaN", COMPLETIONS, b'{"prompt": "Hi", "max_tokens": 2, "temperature": NaN}',
     "temperature"),
    ("top_p 0", COMPLETIONS, {**GOOD, "top_p": 0}, "top_p"),
    ("top_p 1.5", COMPLETIONS, {**GOOD, "top_p": 1.5}, "top_p"),
    ("empty messages", CHAT, {"messages": []}, "messages"),
    ("stop token id out of vocab", COMPLETIONS, {**GOOD, "stop_token_ids": [10**6]},
     "stop_token_ids"),
    ("empty stop string", COMPLETIONS, {**GOOD, "stop": [""]}, "stop"),
    ("min_tokens above max_tokens", COMPLETIONS, {**GOOD, "min_tokens": 3}, "min_tokens"),
    ("seed beyond 64 bits", COMPLETIONS, {**GOOD, "temperature": 1.0, "seed": 2**70}, "seed"),
    ("n=0", COMPLETIONS, {**GOOD, "n": 0}, "n"),
    ("n above the seats", COMPLETIONS, {**GOOD, "n": 31}, "n"),
    ("best_of below n", COMPLETIONS, {**GOOD, "n": 2, "best_of": 1}, "best_of"),
    ("best_of above n, streamed", COMPLETIONS, {**GOOD, "n": 1, "best_of": 2, "stream": True},
     "best_of"),
    ("n with max_tokens 0", COMPLETIONS, {**GOOD, "max_tokens": 0, "echo": True, "n": 2}, "n"),
    ("logprobs 21", COMPLETIONS, {**GOOD, "logprobs": 21}, "logprobs"),
    ("logprobs -1", COMPLETIONS, {**GOOD, "logprobs": -1}, "logprobs"),
    ("logprobs true (completions)", COMPLETIONS, {**GOOD, "logprobs": True}, "logprobs"),
    ("top_logprobs without logprobs", CHAT, {**GOOD_CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("top_logprobs 21", CHAT, {**GOOD_CHAT, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("unknown logprobs_mode", COMPLETIONS, {**GOOD, "logprobs_mode": "cooked"},
     "logprobs_mode"),
    ("a mixed prompt list", COMPLETIONS, {**GOOD, "prompt": ["Hi", 1]}, "prompt"),
    ("an empty prompt in a list", COMPLETIONS, {**GOOD, "prompt": ["Hi", ""]}, "prompt"),
    ("echo with max_tokens -1", COMPLETIONS, {**GOOD, "max_tokens": -1, "echo": True},
     "max_tokens"),
    ("presence_penalty 3", COMPLETIONS, {**GOOD, "presence_penalty": 3}, "presence_penalty"),
    ("frequency_penalty -2.5", CHAT, {**GOOD_CHAT, "frequency_penalty": -2.5},
     "frequency_penalty"),
    ("repetition_penalty 0", COMPLETIONS, {**GOOD, "repetition_penalty": 0}, "repetition_penalty"),
    ("logit_bias 500", COMPLETIONS, {**GOOD, "logit_bias": {"42": 500.0}}, "logit_bias"),
    ("logit_bias not a token", COMPLETIONS, {**GOOD, "logit_bias": {"cat": 1.0}}, "logit_bias"),
    ("min_p 2", COMPLETIONS, {**GOOD, "min_p": 2.0}, "min_p"),
    ("allowed_token_ids empty", COMPLETIONS, {**GOOD, "allowed_token_ids": []},
     "allowed_token_ids"),
    ("bad_words", COMPLETIONS, {**GOOD, "bad_words": ["cat"]}, "bad_words"),
]


def send_bad(server: RunningServer, path: str, body: dict | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        body = {"content": body, "headers": {"content-type": "application/json"}}
    elif "content" not in body:
        body = {"json": body}
    return httpx.post(server.url + path, **body, timeout=30)


@pytest.mark.parametrize(("name", "path", "body", "param"), BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request(server, name, path, body, param):
    error = check_error(send_bad(server, path, body), 400, param=param)
    print(f"{name}: {error}")
    if "JSON" in name:
        assert "JSON" in error["message"]
    if param:  # the message names what was wrong
        assert param.split(".")[0] in error["message"]


@pytest.mark.parametrize(("path", "body", "where"), [
    (CHAT, '{"messages": [{"role": "user", "content": "Hi \\ud800"}]}', "messages[0].content"),
    (CHAT, '{"messages": [{"role": "user", "content": "Hi"}], "stop": ["\\udfff"]}', "stop[0]"),
    (COMPLETIONS, '{"prompt": "Hi", "model": "\\ud800"}', "model"),
    ("/v1/responses", '{"input": "\\ud800"}', "input"),
    ("/v1/messages", '{"model": "default", "max_tokens": 2, "messages": [{"role": "user", '
                     '"content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages[0].content[0].text"),
    ("/tokenize", '{"prompt": "\\ud800"}', "prompt"),
    ("/v1/responses", '{"input": [{"role": "user", "content": "Hi", "\\ud800": 1}]}',
     "input[0] (a key)"),
])
def test_a_lone_surrogate_is_a_400_naming_where(server, path, body, where):
    """JSON lets "\\ud800" through; no text can be encoded from it, so it is refused up front
    (it used to fail later, in the tokenizer or the engine's messages, as a 500)."""
    r = httpx.post(server.url + path, content=body.encode(), timeout=30,
                   headers={"content-type": "application/json"})
    print(r.status_code, r.text)
    assert r.status_code == 400
    message = (r.json()["error"]["message"])
    assert f"{where} holds a lone UTF-16 surrogate" in message


@pytest.mark.parametrize("depth", [600, 900])
def test_a_deeply_nested_body_is_a_400(server, depth):
    """JSON nested as deep as the parser takes is refused, never a 500."""
    body = '{"prompt": ' + "[" * depth + "1" + "]" * depth + ', "max_tokens": 2}'
    r = httpx.post(server.url + COMPLETIONS, content=body.encode(), timeout=30,
                   headers={"content-type": "application/json"})
    print(depth, r.status_code, r.text[:200])
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt")


def test_tokenize_refuses_a_field_it_does_not_have_and_takes_null(server):
    r = httpx.post(server.url + "/tokenize", timeout=30, json={
        "messages": [{"role": "user", "content": "Hi"}], "temperature": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text
    r = httpx.post(server.url + "/tokenize", timeout=30, json={
        "messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": None,
        "return_token_strs": None})
    with_prompt = httpx.post(server.url + "/tokenize", timeout=30, json={
        "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and r.json()["tokens"] == with_prompt.json()["tokens"]


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, {**GOOD_CHAT, "logprobs": None, "n": None, "stream": None, "min_tokens": None}),
    (COMPLETIONS, {**GOOD, "echo": None, "n": None, "stream": None, "ignore_eos": None}),
])
def test_null_means_the_default(server, path, body):
    """The openai client sends null for a None it is given: the field's default, as on
    OpenAI's API."""
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1 and r.json()["usage"]["completion_tokens"] >= 1


def test_good_request_right_after_bad_ones(server):
    for _, path, body, _ in BAD_REQUESTS:
        assert send_bad(server, path, body).status_code == 400
    body = complete(server, prompt=PROMPT, max_tokens=4)
    print("after", len(BAD_REQUESTS), "bad requests:", body["choices"][0], body["usage"])
    assert body["usage"]["completion_tokens"] >= 1
    assert stats_when_idle(server)["blocks_used"] == 0


# --- clients that leave ----------------------------------------------------------------------


def test_streaming_disconnect_frees_blocks(server):
    assert stats_when_idle(server)["blocks_used"] == 0
    aborted = aborted_count(server)
    body = {"prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True}
    events = 0
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + COMPLETIONS,
                                                  json=body) as r:
        assert r.status_code == 200
        for _ in sse_events(r.iter_lines()):
            events += 1
            if events == 3:
                break
        during = server.engine.stats()
    left = time.monotonic()
    after = stats_when_idle(server)
    print(f"read {events} events; during {during}; {time.monotonic() - left:.2f} s after "
          f"closing: {after}")
    assert during["running"] == 1 and during["blocks_used"] > 0
    assert after["running"] == 0 and after["blocks_used"] == 0
    assert aborted_count(server) == aborted + 1


def test_non_streaming_client_timeout_frees_blocks(server):
    assert stats_when_idle(server)["blocks_used"] == 0
    aborted = aborted_count(server)
    body = {"prompt": "Tell me a long story.", "max_tokens": 300, "ignore_eos": True,
            "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + COMPLETIONS, json=body, timeout=1.0)
    during = server.engine.stats()
    left = time.monotonic()
    after = stats_when_idle(server)
    print(f"client gave up; then {during}; {time.monotonic() - left:.2f} s later: {after}")
    assert after["running"] == 0 and after["blocks_used"] == 0
    assert aborted_count(server) == aborted + 1  # aborted, not run to its 300 tokens


# --- backpressure ----------------------------------------------------------------------------


def test_backpressure_429(small_server):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[httpx.Response, float]:
        start = time.monotonic()
        r = await client.post(COMPLETIONS, json={
            "prompt": f"Count to ten, take {i}:", "max_tokens": 8, "ignore_eos": True,
            "temperature": 0})
        return r, time.monotonic() - start

    async def burst() -> list[tuple[httpx.Response, float]]:
        async with httpx.AsyncClient(base_url=small_server.url, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(8)))

    results = asyncio.run(burst())
    ok = [(r, t) for r, t in results if r.status_code == 200]
    refused = [(r, t) for r, t in results if r.status_code == 429]
    print(f"statuses {[r.status_code for r, _ in results]}; 200 after "
          f"{[round(t, 2) for _, t in ok]} s, 429 after {[round(t, 2) for _, t in refused]} s")
    assert len(ok) + len(refused) == 8
    assert len(ok) >= 2  # one seat plus a waiting line of two: at least two get in
    assert refused, "nobody was turned away"
    for r, _ in refused:
        check_error(r, 429, "rate_limit_error")
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(r.headers["Retry-After"]) >= 1
    for r, _ in ok:
        assert r.json()["usage"]["completion_tokens"] == 8
    assert max(t for _, t in refused) < max(t for _, t in ok)  # turned away at once

    assert stats_when_idle(small_server)["blocks_used"] == 0
    again = post(small_server, COMPLETIONS, {"prompt": "Hi", "max_tokens": 2})
    print("once drained:", again["usage"])


# --- metrics ---------------------------------------------------------------------------------


def test_metrics(server):
    stats_when_idle(server)
    before = scrape(server)
    body = complete(server, prompt="Metrics, please: one two three", max_tokens=5,
                    ignore_eos=True)
    after = scrape(server)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    generated = delta("nano_vllm:generation_tokens_total")
    prompt = delta("nano_vllm:prompt_tokens_total")
    ttft = delta("nano_vllm:time_to_first_token_seconds_count")
    print(f"usage {body['usage']}; deltas: generation {generated}, prompt {prompt}, "
          f"ttft count {ttft}")
    assert generated == body["usage"]["completion_tokens"] == 5
    assert prompt == body["usage"]["prompt_tokens"]  # < one block: nothing came from the cache
    assert ttft == 1
    assert delta('nano_vllm:request_success_total{finished_reason="length"}') == 1

    gauges = {name: after[f"nano_vllm:{name}"] for name in (
        "num_requests_running", "num_requests_waiting", "kv_blocks_total", "kv_blocks_used",
        "kv_blocks_free", "kv_blocks_cached_free", "kv_cache_usage_perc")}
    print("gauges:", gauges)
    assert gauges["num_requests_running"] == 0 and gauges["num_requests_waiting"] == 0
    assert gauges["kv_blocks_total"] == server.engine.stats()["blocks_total"]
    assert (gauges["kv_blocks_free"] + gauges["kv_blocks_used"] + gauges["kv_blocks_cached_free"]
            == gauges["kv_blocks_total"])
