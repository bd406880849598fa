"""logprobs, top_logprobs, echo and prompt logprobs over HTTP, against Hugging Face's
log_softmax of its own logits (tolerance: tests/conftest.py's LOGITS_ATOL)."""

from __future__ import annotations

import math

import torch

from tests.api.test_server import CHAT_HI, PROMPT, chat, complete, stream
from tests.conftest import LOGITS_ATOL, PROMPTS

LONG = PROMPTS[2]  # 25 tokens: a full block, so a second request could hit the cache


def hf_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """Row j: Hugging Face's log_softmax over the token after position j."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([token_ids])).logits[0].float(), -1)


def max_diff(ours: list[float], hf: torch.Tensor, targets: list[int]) -> float:
    return max(abs(a - hf[k, t].item()) for k, (a, t) in enumerate(zip(ours, targets,
                                                                          strict=True)))


def test_completion_logprobs_equal_hf_streamed_or_not(server, hf_model, tokenizer):
    request = {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "logprobs": 3}
    body = complete(server, **request)
    [choice] = body["choices"]
    lp = choice["logprobs"]
    ids = tokenizer(PROMPT).input_ids
    generated = tokenizer(choice["text"], add_special_tokens=False).input_ids
    hf = hf_logprobs(hf_model, ids + generated)[len(ids) - 1:]
    diff = max_diff(lp["token_logprobs"], hf, generated)
    print(f"text {choice['text']!r}\ntokens {lp['tokens']}\noffsets {lp['text_offset']}\n"
          f"top {lp['top_logprobs'][0]}\nmax |ours - HF| = {diff:.2e}")
    assert len(lp["tokens"]) == body["usage"]["completion_tokens"] == len(generated) == 6
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:k])) for k in range(6)]
    assert diff <= LOGITS_ATOL
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                 strict=True):
        assert 3 <= len(top) <= 4 and top[token] == value  # the top 3 and the chosen one
        assert value == max(top.values())  # greedy: the chosen is the most likely

    events = stream(server, "/v1/completions", {**request, "temperature": 0})
    streamed = [e["choices"][0]["logprobs"] for e in events]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [v for s in streamed for v in s["token_logprobs"]] == lp["token_logprobs"]
    assert [o for s in streamed for o in s["text_offset"]] == lp["text_offset"]


def test_echo_with_prompt_logprobs_as_lm_eval_asks(server, hf_model, tokenizer):
    """lm-evaluation-harness scores a text with echo, logprobs 1 and max_tokens 1 (or 0);
    the second time, the prompt's blocks sit in the prefix cache, but are scored anyway."""
    ids = tokenizer(LONG).input_ids
    hf = hf_logprobs(hf_model, ids)
    for attempt in range(2):
        body = complete(server, prompt=ids, max_tokens=1, echo=True, logprobs=1)
        [choice] = body["choices"]
        lp = choice["logprobs"]
        diff = max_diff(lp["token_logprobs"][1:len(ids)], hf, ids[1:])
        print(f"attempt {attempt}: usage {body['usage']}, first entries "
              f"{lp['tokens'][:3]} {lp['token_logprobs'][:3]}; max |ours - HF| = {diff:.2e}")
        assert choice["text"].startswith(tokenizer.decode(ids))
        assert len(lp["tokens"]) == len(ids) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert diff <= LOGITS_ATOL
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    plain = complete(server, prompt=ids, max_tokens=1)
    print("without logprobs, the prefix cache serves:", plain["usage"])
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 16

    only = complete(server, prompt=LONG, max_tokens=0, echo=True, logprobs=0)
    [choice] = only["choices"]
    print("max_tokens 0:", choice["text"], choice["finish_reason"], only["usage"])
    assert choice["text"] == LONG and choice["finish_reason"] == "length"
    assert only["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["token_logprobs"][1:] == lp["token_logprobs"][1:len(ids)]
    assert all(len(t) == 1 for t in choice["logprobs"]["top_logprobs"][1:])


def test_echo_streams_the_prompt_first(server):
    events = stream(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3,
                                                "echo": True, "temperature": 0})
    texts = [e["choices"][0]["text"] for e in events]
    print("echoed stream:", texts)
    assert texts[0].startswith(PROMPT) and len(texts) == 3
    whole = complete(server, prompt=PROMPT, max_tokens=3, echo=True)
    assert "".join(texts) == whole["choices"][0]["text"]


def test_chat_logprobs_streamed_or_not(server):
    body = chat(server, messages=CHAT_HI, max_tokens=16, logprobs=True, top_logprobs=2)
    [choice] = body["choices"]
    content = choice["logprobs"]["content"]
    print("chat:", choice["message"]["content"], "\nfirst entry:", content[0])
    assert choice["finish_reason"] == "stop"  # end-of-sequence: not part of the content...
    assert len(content) == body["usage"]["completion_tokens"]  # ...but it has its entry
    eos = content[-1]
    print("end-of-sequence entry:", eos)
    assert eos["token"] == "" and eos["bytes"] == [] and math.isfinite(eos["logprob"])
    assert eos["top_logprobs"][0] == {"token": "", "logprob": eos["logprob"], "bytes": []}
    assert bytes(b for e in content for b in e["bytes"]).decode() == choice["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
               for e in content)
    events = stream(server, "/v1/chat/completions", {"messages": CHAT_HI, "max_tokens": 16,
                                                     "temperature": 0, "logprobs": True})
    streamed = [entry for e in events if e["choices"][0]["logprobs"]
                for entry in e["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in content]
    assert all(e["top_logprobs"] == [] for e in streamed)


# Greedy, the model ends its answer here: end-of-sequence is the next token (p ~ 0.43).
ENDS = "Question: Which planet do we live on?\nAnswer: Earth"
CONTEXT = "Question: Which planet do we live on?\nAnswer:"  # ENDS less its continuation


def test_completion_ending_on_eos_lists_it(server, hf_model, tokenizer):
    """The sampled end-of-sequence token is counted in usage, so it is listed too: its
    string is "" (the text leaves it out), its logprob is there, in every shape."""
    ids = tokenizer(ENDS).input_ids
    eos = hf_logprobs(hf_model, ids)[-1, tokenizer.eos_token_id].item()
    request = {"prompt": ENDS, "max_tokens": 4, "logprobs": 1}
    body = complete(server, **request)
    [choice] = body["choices"]
    lp = choice["logprobs"]
    print("ends on EOS:", choice, body["usage"], f"HF {eos:.4f}")
    assert choice["finish_reason"] == "stop" and choice["text"] == ""
    assert body["usage"]["completion_tokens"] == 1
    assert lp["tokens"] == [""] and lp["text_offset"] == [0]
    assert math.isfinite(lp["token_logprobs"][0])
    assert abs(lp["token_logprobs"][0] - eos) <= LOGITS_ATOL
    assert lp["top_logprobs"] == [{"": lp["token_logprobs"][0]}]
    events = stream(server, "/v1/completions", {**request, "temperature": 0})
    streamed = [e["choices"][0]["logprobs"] for e in events]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [v for s in streamed for v in s["token_logprobs"]] == lp["token_logprobs"]
    assert [o for s in streamed for o in s["text_offset"]] == lp["text_offset"]


def test_echo_ending_on_eos_scores_the_whole_continuation(server, hf_model, tokenizer):
    """As lm-evaluation-harness scores a continuation (echo, max_tokens 1, logprobs 1): it
    sums token_logprobs[ctxlen:-1], the last entry being the sampled token, here EOS."""
    ids = tokenizer(ENDS).input_ids
    ctxlen = len(tokenizer(CONTEXT).input_ids)
    hf = hf_logprobs(hf_model, ids)
    request = {"prompt": ENDS, "max_tokens": 1, "logprobs": 1, "echo": True}
    body = complete(server, **request)
    [choice] = body["choices"]
    lp = choice["logprobs"]
    scored = lp["token_logprobs"][ctxlen:-1]  # what the harness sums
    diff = max_diff(scored, hf[ctxlen - 1:], ids[ctxlen:])
    print(f"echo: {lp['tokens'][ctxlen:]} {lp['token_logprobs'][ctxlen:]}; the continuation's "
          f"max |ours - HF| = {diff:.2e}")
    assert choice["finish_reason"] == "stop" and choice["text"] == ENDS
    assert len(lp["tokens"]) == len(ids) + body["usage"]["completion_tokens"] == len(ids) + 1
    assert lp["tokens"][-1] == "" and lp["tokens"][-2] == " Earth"
    assert len(scored) == len(ids) - ctxlen and diff <= LOGITS_ATOL
    assert lp["top_logprobs"][-1][""] == lp["token_logprobs"][-1]
    assert len(lp["text_offset"]) == len(lp["tokens"]) and lp["text_offset"][-1] == len(ENDS)
    events = stream(server, "/v1/completions", {**request, "temperature": 0})
    streamed = [e["choices"][0]["logprobs"] for e in events]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [v for s in streamed for v in s["token_logprobs"]] == lp["token_logprobs"]
    assert [o for s in streamed for o in s["text_offset"]] == lp["text_offset"]


def test_stop_token_id_is_listed_in_its_own_spelling(server, tokenizer):
    """A stop_token_ids token is left out of the text like EOS, and listed like it, but
    spelled as itself: it is an ordinary token."""
    free = complete(server, prompt=PROMPT, max_tokens=3, ignore_eos=True, logprobs=0)
    first = tokenizer(free["choices"][0]["text"], add_special_tokens=False).input_ids[0]
    body = complete(server, prompt=PROMPT, max_tokens=3, ignore_eos=True, logprobs=0,
                    stop_token_ids=[first])
    [choice] = body["choices"]
    lp = choice["logprobs"]
    print("stopped by a stop token id:", choice)
    assert choice["finish_reason"] == "stop" and choice["text"] == ""
    assert body["usage"]["completion_tokens"] == 1
    assert lp["tokens"] == [tokenizer.decode([first])]
    assert lp["token_logprobs"] == free["choices"][0]["logprobs"]["token_logprobs"][:1]


def test_processed_logprobs_after_top_k(server):
    body = complete(server, prompt=PROMPT, max_tokens=4, temperature=0.7, top_k=2, seed=3,
                    logprobs=3, logprobs_mode="processed")
    tops = body["choices"][0]["logprobs"]["top_logprobs"]
    print("processed, top_k 2:", tops)
    for top in tops:
        values = sorted(top.values(), reverse=True)
        assert values[2] == -9999.0  # the third token is outside top-k: cannot be picked
        assert abs(sum(torch.tensor(values[:2]).exp().tolist()) - 1) < 1e-4


def test_openai_client_logprobs(client):
    resp = client.completions.create(model="default", prompt=PROMPT, max_tokens=2,
                                     temperature=0, echo=True, logprobs=1)
    lp = resp.choices[0].logprobs
    print("openai completions:", lp.tokens, lp.token_logprobs)
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.text_offset)
    chat_resp = client.chat.completions.create(model="default", messages=CHAT_HI, max_tokens=4,
                                               temperature=0, logprobs=True, top_logprobs=3)
    content = chat_resp.choices[0].logprobs.content
    print("openai chat:", [(c.token, c.logprob) for c in content])
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)
