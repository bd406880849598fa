"""Prompt lists, n and best_of over HTTP: choice indexing, streaming, usage, and the prompt
computed once for all its samples."""

from __future__ import annotations

import time

import httpx

from tests.api.test_server import (
    COMPLETIONS,
    PROMPT,
    aborted_count,
    complete,
    hf_greedy,
    scrape,
    stats_when_idle,
    stream,
)

PROMPTS = [PROMPT, "Paris is the capital of"]


def texts_by_index(choices: list[dict]) -> dict[int, str]:
    return {c["index"]: c["text"] for c in choices}


def test_prompt_lists_get_n_choices_each(server, tokenizer):
    alone = [complete(server, prompt=p, max_tokens=5, ignore_eos=True)["choices"][0]["text"]
             for p in PROMPTS]
    by_text = complete(server, prompt=PROMPTS, max_tokens=5, n=2, ignore_eos=True)
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    by_ids = complete(server, prompt=ids, max_tokens=5, n=2, ignore_eos=True)
    print("alone:", alone, "\nlist of texts:", by_text["choices"], "\nusage:", by_text["usage"])
    expected = {0: alone[0], 1: alone[0], 2: alone[1], 3: alone[1]}
    assert texts_by_index(by_text["choices"]) == expected
    assert [c["index"] for c in by_text["choices"]] == [0, 1, 2, 3]
    assert texts_by_index(by_ids["choices"]) == expected
    usage = by_text["usage"]
    assert usage["prompt_tokens"] == sum(len(i) for i in ids)  # each prompt counted once
    assert usage["completion_tokens"] == 4 * 5

    events = stream(server, COMPLETIONS, {"prompt": PROMPTS, "max_tokens": 5, "n": 2,
                                          "temperature": 0, "ignore_eos": True,
                                          "stream_options": {"include_usage": True}})
    *chunks, last = events
    order = [e["choices"][0]["index"] for e in chunks]
    streamed = {i: "".join(e["choices"][0]["text"] for e in chunks
                           if e["choices"][0]["index"] == i) for i in range(4)}
    print("streamed indices in order:", order)
    assert streamed == expected and last["usage"] == usage
    assert order != sorted(order)  # interleaved, not one choice after another


def test_greedy_n_equals_hf_and_the_prompt_is_computed_once(server, hf_model, tokenizer):
    ids = tokenizer(PROMPTS[1] + " France, and its largest city is").input_ids
    stats_when_idle(server)
    before = scrape(server)
    body = complete(server, prompt=ids, max_tokens=6, n=8, ignore_eos=True)
    after = scrape(server)
    prompt = after["nano_vllm:prompt_tokens_total"] - before["nano_vllm:prompt_tokens_total"]
    generated = (after["nano_vllm:generation_tokens_total"]
                 - before["nano_vllm:generation_tokens_total"])
    expected = tokenizer.decode(hf_greedy(hf_model, ids, 6))
    print(f"n=8: prompt tokens computed {prompt} (prompt {len(ids)}), generated {generated}; "
          f"choices {[c['text'] for c in body['choices']]}; HF {expected!r}")
    assert prompt == len(ids) and generated == 8 * 6
    assert [c["text"] for c in body["choices"]] == [expected] * 8
    assert body["usage"]["completion_tokens"] == 48
    assert stats_when_idle(server)["blocks_used"] == 0


def test_best_of_returns_the_samples_of_highest_cumulative_logprob(server):
    request = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 5,
               "ignore_eos": True}
    every = complete(server, **request, n=3, logprobs=0)
    scores = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in every["choices"]}
    best = complete(server, **request, n=1, best_of=3)
    top2 = complete(server, **request, n=2, best_of=3)
    ranked = sorted(scores, key=scores.get, reverse=True)
    print("samples and cumulative logprobs:", scores, "\nbest_of 3:", best["choices"],
          "\nn 2 of 3:", [c["text"] for c in top2["choices"]])
    assert [c["text"] for c in best["choices"]] == ranked[:1]
    assert [c["text"] for c in top2["choices"]] == ranked[:2]
    assert best["choices"][0]["logprobs"] is None  # used for ranking, not asked for
    assert best["usage"]["completion_tokens"] == 18  # every sample's tokens count


def test_disconnect_aborts_every_sample_and_frees_every_block(server):
    assert stats_when_idle(server)["blocks_used"] == 0
    aborted = aborted_count(server)
    body = {"prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True, "n": 4}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + COMPLETIONS,
                                                  json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 12:
                break
        during = server.engine.stats()
    left = time.monotonic()
    after = stats_when_idle(server)
    print(f"during {during}; {time.monotonic() - left:.2f} s after leaving: {after}")
    assert during["running"] == 4
    assert after["running"] == 0 and after["blocks_used"] == 0
    assert aborted_count(server) == aborted + 4


def test_openai_client_prompt_lists_and_n(client):
    resp = client.completions.create(model="default", prompt=PROMPTS, max_tokens=3,
                                     temperature=0, n=2)
    print("openai:", [(c.index, c.text) for c in resp.choices], resp.usage)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert resp.choices[0].text == resp.choices[1].text != resp.choices[2].text
    chat = client.chat.completions.create(model="default", n=3, max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert [c.message.content for c in chat.choices] == [chat.choices[0].message.content] * 3
