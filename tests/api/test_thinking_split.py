"""The reasoning parsers on hand-written outputs (api/thinking.py): the thinking and the answer
taken apart the same way whole and at every point of a stream, tags cut anywhere; the
parser picked from the chat template; the prompt's state read from the rendered prompt."""

from __future__ import annotations

import pytest

from api.thinking import (
    ReasoningParser,
    SplitStream,
    resolve_parser,
    split,
    template_thinks,
    text_after_close,
)
from tests.families import TEMPLATES

QWEN3 = resolve_parser("qwen3", None)
R1 = resolve_parser("deepseek_r1", None)

# (parser, the prompt leaves the span open, output, reasoning, content)
OUTPUTS = [
    (QWEN3, False, "<think>\nLet me see.\n</think>\n\nIt is 4.", "Let me see.", "It is 4."),
    (QWEN3, False, "It is 4.", None, "It is 4."),  # no thinking at all
    (QWEN3, False, "<thi is not a tag", None, "<thi is not a tag"),
    (QWEN3, True, "Let me see.\n</think>\n\nIt is 4.", "Let me see.", "It is 4."),
    (QWEN3, True, "Cut off while still thin", "Cut off while still thin", ""),
    (QWEN3, False, "<think></think>Done", "", "Done"),
    (QWEN3, False, "<think>a </thinking> b</think>c", "a </thinking> b", "c"),
    (R1, True, "Hmm.</think>\n4", "Hmm.", "4"),  # R1: every prompt leaves it open
    (R1, True, "<think>Hmm.</think>4", "Hmm.", "4"),
]


@pytest.mark.parametrize("parser, starts_open, text, reasoning, content", OUTPUTS)
def test_whole_and_at_every_point_of_a_stream(parser, starts_open, text, reasoning, content):
    whole = split(parser, text, starts_open, finished=True)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    stream = SplitStream()
    sent_reasoning, sent_content = "", ""
    for end in range(1, len(text) + 1):  # every prefix: every cut into tokens
        part = split(parser, text[:end], starts_open, finished=end == len(text))
        for piece in (part.reasoning or "", part.content):
            assert "<think>" not in piece and "</think>" not in piece
        new_reasoning, new_content = stream.deltas(part.reasoning, part.content)
        sent_reasoning += new_reasoning
        sent_content += new_content
        assert not (new_reasoning and sent_content), "reasoning after content"
    assert (sent_reasoning, sent_content) == (reasoning or "", content)


def test_no_parser_keeps_the_text_whole():
    assert split(None, "<think>x</think>y", False, True).content == "<think>x</think>y"


def test_the_prompt_says_where_the_output_starts():
    assert QWEN3.prompt_state("<|im_start|>assistant\n") == "free"
    assert QWEN3.prompt_state("<|im_start|>assistant\n<think>\n") == "open"
    assert QWEN3.prompt_state("assistant\n<think>\n\n</think>\n\n") == "done"
    assert QWEN3.prompt_state("<think>old</think> answer<|im_start|>assistant\n") == "free"
    assert R1.prompt_state("anything") == "open"


def test_the_parser_comes_from_the_template(tokenizer):
    qwen3 = (TEMPLATES / "qwen3.jinja").read_text()
    assert template_thinks(qwen3) and not template_thinks(tokenizer.chat_template)
    assert resolve_parser("auto", qwen3) == ReasoningParser("qwen3", after_close="\n\n")
    assert resolve_parser("auto", tokenizer.chat_template) is None
    assert resolve_parser("none", qwen3) is None
    assert resolve_parser("deepseek_r1", None).always_open
    with pytest.raises(ValueError, match="reasoning parser"):
        resolve_parser("gpt-oss", qwen3)


def test_what_follows_the_close_tag_is_read_from_the_template():
    assert text_after_close(r"{{ '<think>\n\n</think>\n\n' }}", "</think>") == "\n\n"
    assert text_after_close("x</think>\ny", "</think>") == "\n"
    assert text_after_close(None, "</think>") == "\n\n"
