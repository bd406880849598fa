"""Speculative decoding in the engine with the real model: greedy text identical to decoding
without it (prompts that copy, and prompts whose drafts mostly fail), stop strings, max_tokens
and min_tokens exact, preemption while requests speculate, blocks all accounted for."""

from __future__ import annotations

import re

import pytest

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.request import Request, RequestOutput, SamplingParams
from engine.spec_decode import SpeculativeConfig
from kvcache.kv_cache_manager import blocks_for
from kvcache.pool import BLOCK_SIZE

PARAGRAPH = ("The river town of Elmsford was founded in 1823 by a group of millers who chose the "
             "site for its steady current. Within a decade the town had three mills, a school, "
             "and a wooden bridge that carried wagons across to the eastern farms. The bridge "
             "burned in 1861 and was replaced by a stone arch that still stands today.")
CODE = ("def parse_headers(lines):\n    headers = {}\n    for line in lines:\n        if not line:"
        "\n            break\n        key, _, value = line.partition(':')\n"
        "        headers[key.strip().lower()] = value.strip()\n    return headers\n")
CHATS = {
    "repeat": "Repeat the following paragraph word for word, changing 1823 to 1824:\n\n"
              + PARAGRAPH,
    "rewrite": "Rewrite this paragraph with one change: the town is called Ashford.\n\n"
               + PARAGRAPH,
    "extract": "Here is a file:\n\n" + CODE + "\nCopy the function parse_headers exactly.",
    "free": "Write a short story about a dragon who learns to cook.",
    # Repeated words that go on differently each time: drafts are proposed, mostly wrong.
    "short": "Repeat exactly: The bridge burned in 1861.",
    "lists": "Continue the list with ten more items, each new: red apple, red car, red door, "
             "red hat, red sky, red wine, red",
}
SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2,
                         disable_by_batch_size=8)


@pytest.fixture(scope="module")
def chats(tokenizer) -> dict[str, list[int]]:
    def ids(text: str) -> list[int]:
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True)
        return out if isinstance(out, list) else out["input_ids"]
    return {name: ids(text) for name, text in CHATS.items()}


def make_engine(model, tokenizer, spec: SpeculativeConfig | None, **overrides) -> BatchEngine:
    engine = BatchEngine(EngineConfig(**{"num_blocks": 128, "speculative": spec, **overrides}),
                         model, tokenizer)
    core_step = engine.core.step

    def checked_step():  # blocks accounted for after every step
        result = core_step()
        engine.core.allocator.check_invariants()
        for r in engine.core.scheduler.running:
            held = len(r.blocks.block_table)
            assert blocks_for(r.num_computed_tokens) <= held <= blocks_for(r.num_tokens)
        return result

    engine.core.step = checked_step
    return engine


def run(engine: BatchEngine, prompts: list[list[int]], **params) -> list[list[RequestOutput]]:
    """Every prompt at once, to the end; each request's outputs. A sample a stop string
    ended is finished for its client at once and in the core at the next step, which frees
    its blocks: so the steps go on until the engine has nothing left to do."""
    outputs: list[list[RequestOutput]] = [[] for _ in prompts]
    for i, ids in enumerate(prompts):
        engine.add_request(Request(str(i), ids, SamplingParams(**{"temperature": 0, **params}),
                                   on_output=outputs[i].append))
    for _ in range(2000):
        if all(outs and outs[-1].finished for outs in outputs) and not engine.has_work():
            break
        engine.step()
    for outs in outputs:
        assert outs[-1].finished and outs[-1].error is None
    assert engine.core.allocator.num_used == 0
    return outputs


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def spec_counts(engine: BatchEngine) -> dict[str, float]:
    text = engine.metrics.render().decode()
    found = dict(re.findall(r"^nano_vllm:spec_decode_(\w+?)_total (\S+)$", text,
                            re.M))
    per_pos = re.findall(r'^nano_vllm:spec_decode_num_accepted_tokens_per_pos_total\{position='
                         r'"(\d+)"\} (\S+)$', text, re.M)
    counts = {k: float(v) for k, v in found.items()}
    counts["per_pos_sum"] = sum(float(v) for _, v in per_pos)
    return counts


def test_greedy_text_is_identical_with_and_without_speculation(model, tokenizer, chats):
    chats = {name: ids for name, ids in chats.items() if name != "short"}
    names = list(chats)
    plain = run(make_engine(model, tokenizer, None), list(chats.values()), max_tokens=48)
    rates = {}
    for name, ids, expected in zip(names, chats.values(), plain):
        engine = make_engine(model, tokenizer, SPEC)
        got = run(engine, [ids], max_tokens=48)[0]
        counts = spec_counts(engine)
        rates[name] = counts.get("num_accepted_tokens", 0) / max(
            counts.get("num_draft_tokens", 0), 1)
        print(f"{name}: {len(got)} outputs for {len(tokens(got))} tokens, {counts}")
        assert tokens(got) == tokens(expected), f"{name}: speculation changed the text"
        assert counts["per_pos_sum"] == counts.get("num_accepted_tokens", 0)
    print("acceptance rates:", rates)
    assert min(rates["repeat"], rates["rewrite"], rates["extract"]) > 0.5
    assert rates["lists"] < 0.5  # drafts mostly wrong, text still identical
    # All at once (5 seated, so 5 requests verifying drafts in the same steps).
    together = run(make_engine(model, tokenizer, SPEC), list(chats.values()), max_tokens=48)
    for name, got, expected in zip(names, together, plain):
        assert tokens(got) == tokens(expected), f"{name}: changed when batched"


def test_stop_string_inside_an_accepted_draft_ends_the_text_there(model, tokenizer, chats):
    params = {"max_tokens": 60, "stop": ["three mills"]}
    expected = run(make_engine(model, tokenizer, None), [chats["repeat"]], **params)[0]
    got = run(make_engine(model, tokenizer, SPEC), [chats["repeat"]], **params)[0]
    text = "".join(o.text for o in got)
    print(f"text: {text!r}; last output's tokens {got[-1].token_ids}")
    assert text == "".join(o.text for o in expected) and text.endswith("the town had ")
    assert tokens(got) == tokens(expected) and got[-1].finish_reason == "stop"
    assert len(got[-1].token_ids) > 1  # the stop string came inside a step of several tokens


def test_max_tokens_and_min_tokens_hold_exactly(model, tokenizer, chats):
    natural = tokens(run(make_engine(model, tokenizer, None), [chats["short"]], max_tokens=30)[0])
    print(f"short answer without min_tokens: {len(natural)} tokens")
    assert len(natural) < 16  # so min_tokens 16 holds its EOS back
    for params in ({"max_tokens": 7}, {"max_tokens": 30, "min_tokens": 16}):
        prompts = [chats["repeat"], chats["short"]]
        expected = run(make_engine(model, tokenizer, None), prompts, **params)
        got = run(make_engine(model, tokenizer, SPEC), prompts, **params)
        for outs, exp in zip(got, expected):
            print(params, len(tokens(outs)), outs[-1].finish_reason)
            assert tokens(outs) == tokens(exp)
            assert params.get("min_tokens", 0) <= len(tokens(outs)) <= params["max_tokens"]


def test_preemption_while_speculating_gives_the_same_answers(model, tokenizer, chats):
    prompts = [chats["repeat"], chats["rewrite"], chats["extract"], chats["lists"]]
    expected = run(make_engine(model, tokenizer, None), prompts, max_tokens=40,
                   ignore_eos=True)
    # The chat template's opening blocks are shared once cached (newcomers wait for them), so
    # the pool is 6 blocks short of what the four need together: someone must yield.
    shared = next(n for n in range(min(map(len, prompts)) // BLOCK_SIZE, -1, -1)
                  if all(p[:n * BLOCK_SIZE] == prompts[0][:n * BLOCK_SIZE] for p in prompts))
    need = sum(blocks_for(len(p) + 40) for p in prompts) - (len(prompts) - 1) * shared
    print("blocks needed:", [blocks_for(len(p) + 40) for p in prompts], f"{shared} shared:",
          need)
    tiny = make_engine(model, tokenizer, SPEC, num_blocks=need - 5, max_num_seqs=4)
    preemptions = []
    preempt = tiny.core.scheduler.preempt

    def recording_preempt(request):
        preemptions.append(request.request_id)
        preempt(request)

    tiny.core.scheduler.preempt = recording_preempt
    got = run(tiny, prompts, max_tokens=40, ignore_eos=True)
    counts = spec_counts(tiny)
    print(f"preempted: {preemptions}; {counts}")
    assert preemptions and counts["num_accepted_tokens"] > 0
    for i, (outs, exp) in enumerate(zip(got, expected)):
        assert len(tokens(outs)) == 40, f"request {i}: tokens duplicated or lost"
        assert tokens(outs) == tokens(exp), f"request {i} changed under preemption"


def test_seeded_sampling_with_speculation_repeats(model, tokenizer, chats):
    params = {"temperature": 0.7, "top_p": 0.9, "seed": 11, "max_tokens": 40}
    first, second = (run(make_engine(model, tokenizer, SPEC), [chats["rewrite"]], **params)[0]
                     for _ in range(2))
    print("sampled:", "".join(o.text for o in first))
    assert tokens(first) == tokens(second)
