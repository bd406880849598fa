"""A thinking span followed token by token (engine/thinking.py), and its budget honoured by the
engine exactly: on its own, with speculative decoding, with samples, under a grammar.

The engine tests use the real model with made-up tags (any token ids will do: the engine
knows tags only as ids), the span opened by the prompt: the model never closes it, so the
budget is what ends it, at exactly that many tokens."""

from __future__ import annotations

import pytest

from engine.request import Request, SamplingParams
from engine.structured.grammar import (
    CompiledGrammar,
    GrammarKind,
    GrammarSpec,
    llguidance_tokenizer,
)
from engine.thinking import Phase, Thinking, ThinkingParams
from tests.engine.test_spec_decode_engine import CHATS, SPEC, make_engine, run, tokens

OPEN, CLOSE, AFTER = 7, [8, 9], [10, 11]  # unit tests' made-up tag ids


def params(**changes) -> ThinkingParams:
    return ThinkingParams(**{"open_id": OPEN, "close_ids": CLOSE, "forced_ids": CLOSE + AFTER,
                             **changes})


def feed(thinking: Thinking, ids: list[int]) -> list[bool]:
    return [thinking.advance(t) for t in ids]


def test_the_output_opens_and_closes_its_own_span():
    thinking = Thinking(params())
    assert thinking.phase is Phase.BEFORE and thinking.may_open == OPEN
    assert feed(thinking, [OPEN, 1, 2, 3, 8]) == [True] * 5
    assert thinking.phase is Phase.INSIDE and thinking.tokens == 4  # 8 may start the close
    assert feed(thinking, [9, 4]) == [True, False]
    assert thinking.phase is Phase.AFTER and thinking.tokens == 3  # the tags not counted


def test_output_that_does_not_open_is_all_answer():
    thinking = Thinking(params())
    assert feed(thinking, [1, OPEN, 2]) == [False, False, False]
    assert thinking.phase is Phase.AFTER and thinking.tokens == 0


def test_a_budget_forces_the_close_and_what_follows():
    thinking = Thinking(params(starts_open=True, budget=3))
    assert thinking.phase is Phase.INSIDE and thinking.may_open is None
    assert thinking.draft_room() == 2  # the step's own token makes the third
    feed(thinking, [1, 2])
    assert thinking.forced_token is None and thinking.draft_room() == 0
    feed(thinking, [3])
    assert thinking.tokens == 3 and thinking.forced == CLOSE + AFTER
    assert thinking.draft_room() == 0
    for expected in CLOSE + AFTER:
        assert thinking.forced_token == expected
        assert thinking.advance(expected)
    assert thinking.phase is Phase.AFTER and thinking.forced_token is None
    assert not thinking.advance(5) and thinking.tokens == 3


def test_a_zero_budget_closes_at_once():
    assert Thinking(params(starts_open=True, budget=0)).forced_token == CLOSE[0]
    opened = Thinking(params(budget=0))
    opened.advance(OPEN)
    assert opened.forced_token == CLOSE[0]


def test_bad_params_are_refused():
    with pytest.raises(ValueError):
        params(budget=-1)
    with pytest.raises(ValueError):
        params(close_ids=[])


# --- in the engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chats(tokenizer) -> dict[str, list[int]]:
    def ids(text: str) -> list[int]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                               add_generation_prompt=True, tokenize=False)
        return tokenizer(prompt, add_special_tokens=False).input_ids
    return {name: ids(text) for name, text in CHATS.items()}


def span(tokenizer, budget: int) -> ThinkingParams:
    """Tags made of the model's own tokens; the prompt opens the span."""
    forced = tokenizer("\n\nSo:", add_special_tokens=False).input_ids
    return ThinkingParams(None, forced[:1], forced, starts_open=True, budget=budget)


@pytest.mark.parametrize("speculative", [False, True])
def test_the_budget_ends_the_span_at_exactly_that_many_tokens(model, tokenizer, chats,
                                                              speculative):
    thinking = span(tokenizer, 9)
    prompts = [chats["repeat"], chats["extract"]]
    plain = run(make_engine(model, tokenizer, None), prompts, max_tokens=30)
    outs = run(make_engine(model, tokenizer, SPEC if speculative else None), prompts,
               max_tokens=30, thinking=thinking)
    for free, bounded in zip(plain, outs, strict=True):
        ids = tokens(bounded)
        assert ids[:9] == tokens(free)[:9]  # the model's own tokens, up to the budget
        assert ids[9:9 + len(thinking.forced_ids)] == thinking.forced_ids
        assert bounded[-1].reasoning_tokens == 9
    if speculative:  # the same tokens either way
        again = run(make_engine(model, tokenizer, None), prompts, max_tokens=30,
                    thinking=thinking)
        assert [tokens(o) for o in again] == [tokens(o) for o in outs]


def test_each_sample_has_its_own_budget(model, tokenizer, chats):
    thinking = span(tokenizer, 4)
    engine = make_engine(model, tokenizer, None)
    outputs = []
    engine.add_request(Request("s", chats["free"], SamplingParams(
        max_tokens=12, temperature=1.0, seed=3, n=3, thinking=thinking),
        on_output=outputs.append))
    while engine.has_work():
        engine.step()
    finals = [o for o in outputs if o.finished]
    assert len(finals) == 3
    for index in range(3):
        ids = [t for o in outputs if o.sample_index == index for t in o.token_ids]
        assert ids[4:4 + len(thinking.forced_ids)] == thinking.forced_ids
    assert {o.reasoning_tokens for o in finals} == {4}


def test_a_grammar_sees_the_answer_only(model, tokenizer, chats):
    """Under a choice grammar the thinking is free; the forced end and then the answer
    follow, and the answer is one of the choices."""
    grammar = CompiledGrammar(GrammarSpec(GrammarKind.CHOICE, ["yes", "no"]),
                              llguidance_tokenizer(tokenizer))
    thinking = span(tokenizer, 5)
    (outs,) = run(make_engine(model, tokenizer, None), [chats["free"]], max_tokens=30,
                  grammar=grammar, thinking=thinking)
    ids = tokens(outs)
    forced_end = 5 + len(thinking.forced_ids)
    assert ids[5:forced_end] == thinking.forced_ids
    assert tokenizer.decode(ids[forced_end:], skip_special_tokens=True) in ("yes", "no")
    assert outs[-1].reasoning_tokens == 5


def test_a_grammar_lets_the_open_tag_through_first(model, tokenizer, chats):
    """Before the output starts, the open tag is allowed besides what the grammar allows."""
    grammar = CompiledGrammar(GrammarSpec(GrammarKind.CHOICE, ["yes", "no"]),
                              llguidance_tokenizer(tokenizer))
    open_id = tokenizer("Well", add_special_tokens=False).input_ids[0]
    forced = tokenizer("\n\nSo:", add_special_tokens=False).input_ids
    thinking = ThinkingParams(open_id, forced[:1], forced, budget=2)
    (outs,) = run(make_engine(model, tokenizer, None), [chats["free"]], max_tokens=20,
                  grammar=grammar, thinking=thinking, logit_bias={open_id: 100.0})
    ids = tokens(outs)
    assert ids[0] == open_id and ids[3:3 + len(forced)] == forced
    assert outs[-1].reasoning_tokens == 2
