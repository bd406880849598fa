"""Structured outputs in the engine: answers that follow their grammar (greedy and seeded
sampling, beside free requests in the same steps), grammar state through preemption, and
the compiler's errors, time limit and cache."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.request import Request, RequestOutput, SamplingParams
from engine.structured.compiler import GrammarCompiler, GrammarTimeout
from engine.structured.grammar import (
    CompiledGrammar,
    GrammarError,
    GrammarKind,
    GrammarSpec,
    llguidance_tokenizer,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 16},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
POINT = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
         "required": ["x", "y"], "additionalProperties": False}
COLORS = {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
          "minItems": 1, "maxItems": 4}
SCHEMAS = [PERSON, POINT, COLORS]
REGEX = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
CHOICES = ["yes", "no", "it \"depends\""]
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def grammars(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


@pytest.fixture(scope="module")
def chat_prompt(tokenizer):
    def build(text: str) -> list[int]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False).input_ids
    return build


def run(engine: BatchEngine, requests: list[Request],
        outputs: dict[str, list[RequestOutput]]) -> dict[str, str]:
    for r in requests:
        engine.add_request(r)
    steps = 0
    while not all(outputs[r.request_id] and outputs[r.request_id][-1].finished
                  for r in requests):
        engine.step()
        steps += 1
        assert steps < 3000, "engine made no progress"
    for r in requests:
        assert outputs[r.request_id][-1].error is None
    return {r.request_id: "".join(o.text for o in outputs[r.request_id]) for r in requests}


def constrained(request_id: str, prompt: list[int], grammar: CompiledGrammar | None,
                outputs: dict[str, list[RequestOutput]], **params) -> Request:
    outputs[request_id] = []
    return Request(request_id, prompt, SamplingParams(max_tokens=MAX_TOKENS, grammar=grammar,
                                                      **params),
                   on_output=outputs[request_id].append)


def test_answers_follow_their_grammar_beside_free_requests(model, tokenizer, grammars,
                                                           chat_prompt):
    """Each schema greedy and with two seeds, a regex and a choice list, and two free
    requests, all in the same steps: every constrained answer parses and validates, and
    ends with finish_reason stop."""
    engine = BatchEngine(EngineConfig(num_blocks=256), model, tokenizer)
    outputs: dict[str, list[RequestOutput]] = {}
    requests, expected = [], {}
    prompt = chat_prompt("Describe something as JSON.")
    for s, schema in enumerate(SCHEMAS):
        grammar = grammars.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, schema))
        for k, (temperature, seed) in enumerate([(0, None), (1.0, 1), (1.0, 2)]):
            rid = f"schema{s}-{k}"
            requests.append(constrained(rid, prompt, grammar, outputs, temperature=temperature,
                                        seed=seed))
            expected[rid] = schema
    regex = grammars.compile_now(GrammarSpec(GrammarKind.REGEX, REGEX))
    choice = grammars.compile_now(GrammarSpec(GrammarKind.CHOICE, CHOICES))
    requests.append(constrained("regex", chat_prompt("Name and number?"), regex, outputs,
                                temperature=0.8, seed=3))
    requests.append(constrained("choice", chat_prompt("Is it raining?"), choice, outputs,
                                temperature=1.0, seed=4))
    for k in range(2):
        requests.append(constrained(f"free{k}", prompt, None, outputs, temperature=0))
    texts = run(engine, requests, outputs)
    for rid, text in texts.items():
        print(f"{rid}: {text!r} ({outputs[rid][-1].finish_reason})")
    for rid, schema in expected.items():
        jsonschema.validate(json.loads(texts[rid]), schema)
        assert outputs[rid][-1].finish_reason == "stop"
    assert re.fullmatch(REGEX, texts["regex"])
    assert texts["choice"] in CHOICES
    assert outputs["choice"][-1].finish_reason == "stop"
    assert texts["free0"] == texts["free1"] and not texts["free0"].startswith("{\"")


def test_preemption_mid_answer_keeps_the_grammar_state(model, tokenizer, grammars,
                                                       chat_prompt):
    """Six constrained answers in a pool too small for all: some are preempted in the middle
    of their JSON and recomputed, and each answer equals the one from a roomy pool."""
    grammar = grammars.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, PERSON))
    prompts = [chat_prompt(f"Describe person number {i} as JSON.") for i in range(6)]

    def answers(num_blocks: int) -> tuple[dict[str, str], list[int]]:
        """The answers, and how many output tokens each preempted request had then."""
        engine = BatchEngine(EngineConfig(num_blocks=num_blocks), model, tokenizer)
        scheduler = engine.core.scheduler  # type: ignore[attr-defined]
        preempted_at: list[int] = []
        preempt = scheduler.preempt

        def record(request: Request) -> None:
            preempted_at.append(request.num_output_tokens)
            preempt(request)

        scheduler.preempt = record
        outputs: dict[str, list[RequestOutput]] = {}
        requests = [constrained(str(i), p, grammar, outputs, temperature=1.0, seed=i)
                    for i, p in enumerate(prompts)]
        return run(engine, requests, outputs), preempted_at

    roomy, none = answers(256)
    tight, preempted_at = answers(12)
    print(f"preempted with this many output tokens: {preempted_at}")
    for rid in roomy:
        print(f"{rid}: {tight[rid]!r}")
        assert tight[rid] == roomy[rid]
        jsonschema.validate(json.loads(tight[rid]), PERSON)
    assert none == [] and any(n >= 5 for n in preempted_at)  # well inside an answer


def test_invalid_grammars_are_errors(tokenizer, grammars):
    cases = [GrammarSpec(GrammarKind.REGEX, "(ab"),
             GrammarSpec(GrammarKind.JSON_SCHEMA, {"type": "nonsense"}),
             GrammarSpec(GrammarKind.JSON_SCHEMA,
                         {"type": "string", "enum": [f"v{i}" for i in range(200_000)]})]
    for spec in cases:
        with pytest.raises(GrammarError) as info:
            grammars.compile_now(spec)
        print(f"{spec.key[:60]}: {info.value}")
    assert "too large" in str(info.value)


def test_compile_past_the_time_limit_is_refused(tokenizer):
    """20,000 enum values take ~45 ms to compile here; the limit is 2 ms. The refusal comes at
    the limit (the compile goes on in its thread), and a small grammar still compiles."""
    compiler = GrammarCompiler(tokenizer, timeout_s=0.002)
    compiler.compile_now(GrammarSpec(GrammarKind.REGEX, "x"))  # the tokenizer, built once
    big = GrammarSpec(GrammarKind.JSON_SCHEMA,
                      {"type": "string", "enum": [f"w{i}" for i in range(20_000)]})

    async def attempt() -> None:
        with pytest.raises(GrammarTimeout) as info:
            await compiler.compile(big)
        print(info.value)
        assert "0.002 s" in str(info.value)
        compiler.timeout_s = 5.0
        assert await compiler.compile(GrammarSpec(GrammarKind.CHOICE, ["a", "b"]))

    asyncio.run(attempt())
    compiler.shutdown()


def test_compiled_grammars_are_cached_by_spec(tokenizer):
    compiler = GrammarCompiler(tokenizer, cache_size=2)
    first = compiler.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, POINT))
    respelled = dict(reversed(list(POINT.items())))  # the same schema, keys reordered
    assert compiler.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, respelled)) is first
    compiler.compile_now(GrammarSpec(GrammarKind.REGEX, "a"))
    compiler.compile_now(GrammarSpec(GrammarKind.REGEX, "b"))  # evicts the oldest
    assert compiler.compile_now(GrammarSpec(GrammarKind.JSON_SCHEMA, POINT)) is not first


def test_a_tag_the_tokenizer_holds_as_one_token_is_accepted_as_that_token(tokenizer):
    """Qwen's tokenizers hold <tool_call> and </tool_call> as added tokens that decode to
    their text but that llguidance counts as special: the call grammar offered that token as
    the text's only form, then refused it, and the answer ended after one token. The rules
    of one literal now take the token too; the text's tokens still work."""
    import copy

    from api.tools.formats import GENERIC
    from api.tools.plan import FunctionTool, call_grammar
    from engine.structured.grammar import with_special_tokens

    CALL_OPEN, CALL_CLOSE = GENERIC.open_tag, GENERIC.close_tag

    tagged = copy.deepcopy(tokenizer)
    tagged.add_tokens([CALL_OPEN, CALL_CLOSE])  # not special: they decode to their text
    open_id, close_id = tagged.convert_tokens_to_ids([CALL_OPEN, CALL_CLOSE])
    assert tagged.decode([open_id], skip_special_tokens=True) == CALL_OPEN
    lt = llguidance_tokenizer(tagged)
    assert lt.is_special_token(open_id)  # what makes the plain grammar fail
    tools = [FunctionTool("f", None, {"type": "object", "properties": {"x": {"type": "integer"}},
                                      "required": ["x"]})]
    grammar = call_grammar(tools, parallel=False, free_text=False)
    print(with_special_tokens(grammar, lt))
    body = tagged('{"name":"f","arguments":{"x":1}}', add_special_tokens=False).input_ids
    for as_tokens in (True, False):
        ids = ([open_id, *body, close_id] if as_tokens else
               tagged(f'{CALL_OPEN}{{"name":"f","arguments":{{"x":1}}}}{CALL_CLOSE}',
                      split_special_tokens=True, add_special_tokens=False).input_ids)
        state = CompiledGrammar(GrammarSpec(GrammarKind.LARK, grammar), lt).matcher()
        bits = state.allowed_bits()
        assert bits[open_id // 8] >> (open_id % 8) & 1  # the token is offered first
        assert not any(state.accept(t) for t in ids), (as_tokens, ids)
        assert state.finished, as_tokens
