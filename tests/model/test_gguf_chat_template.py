"""A GGUF file's chat template: an instruct model's file carries one in
`tokenizer.chat_template`, which chat requests render through; a pretrained model's file has
none, and chat requests get the 400 that says so (or `--chat-template FILE` gives one).
Both real files are in the cache where .ci/run fetched them; elsewhere these skip."""

from __future__ import annotations

import pytest

from api.errors import APIError
from api.tokenization import render_chat
from engine.load import use_chat_template
from model.gguf.source import load_tokenizer, release_path
from tests.conftest import missing

HELLO = [{"role": "user", "content": "Hello"}]


def tokenizer_of(name: str):
    path = release_path(name)
    if not path.is_file():
        missing(f"{path} (python3 -m model.gguf.source {name} fetches it)")
    return load_tokenizer(path)


def test_an_instruct_file_brings_its_chat_template():
    tokenizer = tokenizer_of("qwen2.5-coder-0.5b-instruct")
    text = render_chat(tokenizer, HELLO, add_generation_prompt=True)
    assert "<|im_start|>user\nHello<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_file_without_one_is_refused_until_one_is_given(tmp_path):
    tokenizer = tokenizer_of("gemma-3-270m")
    with pytest.raises(APIError) as err:
        render_chat(tokenizer, HELLO, add_generation_prompt=True)
    assert err.value.code == "chat_template_missing"
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    use_chat_template(tokenizer, str(template))
    assert render_chat(tokenizer, HELLO, add_generation_prompt=True) == "<user>Hello\n<assistant>"
