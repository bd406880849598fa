"""Each family's tool-call syntax (api/tools/formats.py): picked from the chat template, read
back from hand-written answers whole and at every point of a stream (tags cut anywhere),
with the thinking before the calls taken apart, and enforced by its grammar."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from api.answer import AnswerReader, ChatFormat
from api.thinking import resolve_parser
from api.tools.calls import CallStream, scan
from api.tools.formats import GENERIC, HERMES, LLAMA3_JSON, resolve_format
from api.tools.plan import FunctionTool, call_grammar
from engine.structured.grammar import llguidance_tokenizer, with_special_tokens
from tests.families import TEMPLATES, save_family

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [FunctionTool("get_weather", None, WEATHER),
         FunctionTool("get_time", None, {"type": "object", "properties": {}})]
CALLS = [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]  # as spaced JSON

# (format, answer text, content, whether a thinking parser reads it)
ANSWERS = [
    (HERMES, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
             '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
             '</tool_call>', "Let me check.", False),
    (HERMES, '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"name": '
             '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
             '{"name": "get_time", "arguments": {}}\n</tool_call>', "", True),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": '
                  '"get_time", "parameters": {}}', "", False),
    (resolve_format("llama3_json", "tools <|python_tag|>"),
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": '
     '"get_time", "parameters": {}}', "", False),
    (GENERIC, '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>\n'
              '<tool_call>{"name":"get_time","arguments":{}}</tool_call>', "", False),
]
MARKUP = ("<tool_call>", "</tool_call>", "<think>", "</think>", '{"name"', "<|python_tag|>")


def reader(form, thinks: bool) -> AnswerReader:
    parser = resolve_parser("qwen3" if thinks else "none", None)
    return AnswerReader(ChatFormat(parser, form), may_call=True, thinking="free")


@pytest.mark.parametrize("form, text, content, thinks", ANSWERS,
                         ids=[f"{a[0].name}-{i}" for i, a in enumerate(ANSWERS)])
def test_calls_read_whole_and_at_every_point_of_a_stream(form, text, content, thinks):
    read = reader(form, thinks)
    whole = read.read(text, finished=True)
    assert whole.content == content
    found = read.scan(whole.calls)
    calls = [(name, form.dumps(json.loads(arguments))) for name, arguments in CALLS]
    assert found.complete and [(c.name, c.arguments) for c in found.calls] == calls
    if thinks:
        assert whole.reasoning == "The user wants weather."
    stream, sent_content, sent_reasoning = CallStream(form), "", ""
    arguments: dict[int, str] = {}
    for end in range(1, len(text) + 1):  # every prefix: every cut of the text into tokens
        part = read.read(text[:end], finished=end == len(text))
        assert whole.content.startswith(part.content)  # never taken back
        assert (whole.reasoning or "").startswith(part.reasoning or "")
        assert not any(tag in part.content or tag in (part.reasoning or "") for tag in MARKUP)
        sent_content, sent_reasoning = part.content, part.reasoning or ""
        for entry in stream.deltas(part.calls) if part.calls is not None else []:
            arguments[entry["index"]] = (arguments.get(entry["index"], "")
                                         + entry["function"]["arguments"])
    assert sent_content == content and sent_reasoning == (whole.reasoning or "")
    assert [arguments[i] for i in range(len(calls))] == [a for _, a in calls]


def test_text_that_only_looks_like_a_call_is_content():
    """Hermes: a partial marker at the end is held back while streaming, and is content
    once the answer ends."""
    read = reader(HERMES, thinks=False)
    assert read.read("It is <tool", finished=False).content == "It is"
    assert read.read("It is <tool", finished=True).content == "It is <tool"


BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("form", [HERMES, GENERIC])
@pytest.mark.parametrize("text", [BARE, f"```json\n{BARE}\n```\n", f" {BARE.replace(' ', '')}"])
def test_a_whole_answer_that_is_one_bare_call_is_that_call(form, text):
    """Under `auto`, an answer that is only a JSON object naming a tool with its arguments
    (bare, compact or fenced, as small models write it) is the call; while streaming,
    nothing of it shows until the answer ends."""
    read = AnswerReader(ChatFormat(None, form), may_call=True, thinking="free",
                        bare_tools={"get_weather": WEATHER})
    whole = read.read(text, finished=True)
    assert whole.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in read.scan(whole.calls).calls] == [
        ("get_weather", {"city": "Paris"})]
    for end in range(1, len(text)):
        part = read.read(text[:end], finished=False)
        assert part.content == "" and part.calls is None, text[:end]


@pytest.mark.parametrize("text", [
    '{"name": "get_time", "arguments": {}}',  # not a tool it may call
    '{"name": "John", "age": 3}',  # JSON, not a call
    '{"name": "get_weather", "arguments": {"town": "Paris"}}',  # not what its schema takes
    f"Here it is: {BARE}",  # a call inside text
    f"{BARE}\nand more",
])
def test_json_that_is_not_a_whole_bare_call_is_content(text):
    read = AnswerReader(ChatFormat(None, HERMES), may_call=True, thinking="free",
                        bare_tools={"get_weather": WEATHER})
    assert read.read(text, finished=True).content == text
    assert read.read(text, finished=True).calls is None
    shown = [read.read(text[:end], finished=end == len(text)).content
             for end in range(1, len(text) + 1)]
    assert all(text.startswith(piece) for piece in shown) and shown[-1] == text


def test_the_format_comes_from_the_chat_template(tokenizer):
    assert resolve_format("auto", (TEMPLATES / "qwen3.jinja").read_text()) is HERMES
    assert resolve_format("auto", (TEMPLATES / "llama3.jinja").read_text()) is LLAMA3_JSON
    assert resolve_format("auto", tokenizer.chat_template) is GENERIC  # SmolLM2: no tools
    assert resolve_format("hermes", tokenizer.chat_template) is HERMES  # named
    assert resolve_format("auto", "tools <|python_tag|> <|start_header_id|> "
                                  '"parameters"').prefix == "<|python_tag|>"
    with pytest.raises(ValueError, match="tool-call parser"):
        resolve_format("mistral", None)


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory, model_dir: Path) -> dict[str, llguidance.LLTokenizer]:
    from transformers import AutoTokenizer

    found = {}
    for family in ("qwen3", "llama3"):
        folder = save_family(family, tmp_path_factory.mktemp(family), model_dir)
        found[family] = (AutoTokenizer.from_pretrained(folder),
                         llguidance_tokenizer(AutoTokenizer.from_pretrained(folder)))
    return found


def accepts(tokenizers, family: str, grammar: str, text: str) -> bool:
    hf, lt = tokenizers[family]
    matcher = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_lark(
        with_special_tokens(grammar, lt)), log_level=0)
    ok = matcher.consume_tokens(hf(text, add_special_tokens=False).input_ids)
    return ok and not matcher.is_error() and matcher.is_accepting()


@pytest.mark.parametrize("free_text", [False, True])
def test_each_grammar_takes_its_format_and_no_other(family_tokenizers, free_text):
    """The family's tags come as the tokens its tokenizer holds them as; the JSON is laid
    out as the template shows it ("key": value, spaced), not compact."""
    hermes, llama = ANSWERS[0][1], ANSWERS[2][1]
    calls_only = hermes[hermes.index("<tool_call>"):]
    for family, form, good in (("qwen3", HERMES, calls_only), ("llama3", LLAMA3_JSON, llama)):
        grammar = call_grammar(TOOLS, parallel=True, free_text=free_text, form=form)
        assert accepts(family_tokenizers, family, grammar, good)
        first = good.split("; ")[0].split("\n")[1] if form is HERMES else good.split("; ")[0]
        compact = json.dumps(json.loads(first), separators=(",", ":"))
        if form is HERMES:
            compact = f"<tool_call>\n{compact}\n</tool_call>"
        assert not accepts(family_tokenizers, family, grammar, compact)
    hermes_grammar = call_grammar(TOOLS, parallel=True, free_text=free_text, form=HERMES)
    assert accepts(family_tokenizers, "qwen3", hermes_grammar, hermes) == free_text  # text first
    assert accepts(family_tokenizers, "qwen3", hermes_grammar, "Just text.") == free_text
    single = call_grammar(TOOLS, parallel=False, free_text=False, form=HERMES)
    assert not accepts(family_tokenizers, "qwen3", single, calls_only)  # two calls


def test_scan_stops_at_what_is_not_the_format():
    assert not scan('<tool_call>{"name": "f"', GENERIC).valid
    assert scan('{"name": "f", "parameters": {"a": 1}}; {"na', LLAMA3_JSON).valid
