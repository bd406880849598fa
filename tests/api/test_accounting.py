"""Usage details, continuous usage, request ids, per-request timing, /tokenize and
/detokenize, and stop strings under min_tokens."""

from __future__ import annotations

import httpx

from tests.api.test_server import (
    CHAT,
    CHAT_HI,
    COMPLETIONS,
    PROMPT,
    chat,
    check_error,
    complete,
    post,
    stream,
)


def test_cached_tokens_on_every_response(server):
    first = chat(server, messages=CHAT_HI, max_tokens=2)
    second = chat(server, messages=CHAT_HI, max_tokens=2)
    events = stream(server, CHAT, {"messages": CHAT_HI, "max_tokens": 2, "temperature": 0,
                                   "stream_options": {"include_usage": True}})
    print("first:", first["usage"], "\nsecond:", second["usage"], "\nstream:", events[-1])
    # The chat template's system prompt is over a block long: the second time it is cached.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    assert events[-1]["usage"]["prompt_tokens_details"] == second["usage"][
        "prompt_tokens_details"]
    assert first["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"]


def test_continuous_usage_stats(server):
    events = stream(server, COMPLETIONS, {
        "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    counts = [e["usage"]["completion_tokens"] for e in events]
    print("completion_tokens per chunk:", counts)
    assert counts == [1, 2, 3, 4, 4]  # the last: the usage chunk
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + c
               for e, c in zip(events, counts, strict=True))


def test_request_id_header_is_honoured_and_echoed(server):
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": PROMPT, "max_tokens": 2},
                   headers={"X-Request-Id": "trace-42"}, timeout=30)
    print("with an id:", r.headers.get("x-request-id"), r.json()["id"])
    assert r.headers["x-request-id"] == "trace-42" and r.json()["id"] == "cmpl-trace-42"
    r = httpx.post(server.url + CHAT, json={"messages": CHAT_HI, "max_tokens": 2}, timeout=30)
    assert r.json()["id"] == "chatcmpl-" + r.headers["x-request-id"]
    with httpx.stream("POST", server.url + COMPLETIONS, headers={"X-Request-Id": "s-1"},
                      json={"prompt": PROMPT, "max_tokens": 2, "stream": True}) as r:
        assert r.headers["x-request-id"] == "s-1"
        assert '"id":"cmpl-s-1"' in r.read().decode()
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": PROMPT, "max_tokens": -1},
                   headers={"X-Request-Id": "bad-1"}, timeout=30)
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-1"


def test_timing_record_and_server_timing_header(server, tokenizer):
    prompts = [PROMPT, "Hi"]
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": prompts, "max_tokens": 3,
                                                   "ignore_eos": True}, timeout=30)
    body = r.json()
    print("timing:", body["timing"], "\nServer-Timing:", r.headers["server-timing"])
    assert [t["prompt_index"] for t in body["timing"]] == [0, 1]
    for t, prompt in zip(body["timing"], prompts, strict=True):
        assert 0 <= t["queue_time_ms"] <= t["time_to_first_token_ms"]
        assert t["decode_time_ms"] > 0 and t["num_preemptions"] == 0
        # One sample, no preemption: each prompt token was either found in the prefix
        # cache or computed, once.
        assert (t["prompt_tokens_computed"] + t["prompt_tokens_cached"]
                == len(tokenizer(prompt).input_ids))
    names = [part.split(";")[0] for part in r.headers["server-timing"].split(", ")]
    assert names == ["queue", "ttft", "decode"]
    assert all("timing" not in e for e in stream(server, COMPLETIONS, {
        "prompt": PROMPT, "max_tokens": 2}))


def test_tokenize_and_detokenize(server, tokenizer):
    ids = tokenizer(PROMPT).input_ids
    body = post(server, "/tokenize", {"prompt": PROMPT, "return_token_strs": True})
    print("tokenize:", body)
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(ids)
    assert body["max_model_len"] == server.engine.max_tokens_per_request
    chat_body = post(server, "/tokenize", {"messages": CHAT_HI})
    reply = chat(server, messages=CHAT_HI, max_tokens=1)
    assert chat_body["count"] == reply["usage"]["prompt_tokens"]
    assert chat_body["token_strs"] is None
    assert post(server, "/detokenize", {"tokens": ids}) == {"prompt": PROMPT}
    check_error(httpx.post(server.url + "/detokenize", json={"tokens": [10**7]}),
                param="tokens")
    check_error(httpx.post(server.url + "/tokenize", json={}), param="prompt")


def test_stop_strings_count_only_after_min_tokens(server):
    request = {"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True}
    greedy = complete(server, **request)["choices"][0]["text"]
    stop = greedy.split()[1]  # within the first few tokens
    stopped = complete(server, **request, stop=[stop])
    held = complete(server, **request, stop=[stop], min_tokens=6)
    print(f"greedy {greedy!r}, stop {stop!r}\nwithout min_tokens "
          f"{stopped['choices'][0]['text']!r}\nmin_tokens 6 {held['choices'][0]['text']!r} "
          f"({held['usage']['completion_tokens']} tokens)")
    assert stopped["usage"]["completion_tokens"] < 6
    assert held["usage"]["completion_tokens"] > 6
    assert held["choices"][0]["text"].startswith(greedy[:greedy.find(stop) + len(stop)])


def test_openai_client_accounting_fields(client):
    raw = client.completions.with_raw_response.create(
        model="default", prompt=PROMPT, max_tokens=3, temperature=1.0, seed=2, best_of=2,
        extra_headers={"X-Request-Id": "client-7"},
        extra_body={"logprobs_mode": "processed", "ignore_eos": True})
    resp = raw.parse()
    print("id", resp.id, "usage", resp.usage, "timing", resp.model_extra.get("timing"),
          "Server-Timing", raw.headers.get("server-timing"))
    assert resp.id == "cmpl-client-7" and raw.headers["x-request-id"] == "client-7"
    assert len(resp.choices) == 1 and resp.usage.completion_tokens == 6  # both samples
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    assert resp.model_extra["timing"][0]["prompt_index"] == 0
    chunks = list(client.completions.create(
        model="default", prompt=PROMPT, max_tokens=2, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert [c.usage.completion_tokens for c in chunks] == [1, 2, 2]
