"""A model folder without a chat template, --chat-template, and what /v1/models says.

The folder is a tiny random Qwen2 made with transformers' config class, with the default
model's tokenizer files but not its chat template; the engine is load_engine's, as the
server builds it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from api.app import create_app
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.load import load_engine, use_chat_template
from server import build_parser

TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, model_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = tmp_path_factory.mktemp("no-template")
    hf.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # no chat_template.jinja
        shutil.copy(model_dir / name, out / name)
    return out


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    return path


def client(engine: BatchEngine) -> Iterator[TestClient]:
    engine.start()
    try:
        with TestClient(create_app(engine, "tiny")) as c:
            yield c
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def bare(folder) -> Iterator[TestClient]:
    yield from client(load_engine(EngineConfig(model=str(folder), num_blocks=16)))


@pytest.fixture(scope="module")
def templated(folder, template_file) -> Iterator[TestClient]:
    yield from client(load_engine(EngineConfig(model=str(folder), num_blocks=16,
                                               chat_template=str(template_file))))


def chat(c: TestClient):
    return c.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                "max_tokens": 3, "temperature": 0})


def test_no_chat_template_is_a_400_that_says_what_to_do(bare):
    r = chat(bare)
    print(r.status_code, r.json())
    assert r.status_code == 400
    error = r.json()["error"]
    assert "no chat template" in error["message"]
    assert "/v1/completions" in error["message"] and "--chat-template" in error["message"]
    assert error["code"] == "chat_template_missing" and error["param"] == "messages"
    r = bare.post("/tokenize", json={"messages": MESSAGES})
    assert r.status_code == 400 and "no chat template" in r.json()["error"]["message"]
    # Plain completions need no template.
    r = bare.post("/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def test_chat_template_flag_renders_the_messages(templated, folder):
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(folder)(
        "[system] Be brief.\n[user] Hi\n[assistant] ", add_special_tokens=False).input_ids
    r = templated.post("/tokenize", json={"messages": MESSAGES})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == expected
    r = chat(templated)
    print(r.json())
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(expected)
    assert r.json()["usage"]["completion_tokens"] == 3


def test_models_lists_architecture_and_context_length(bare):
    card = bare.get("/v1/models").json()["data"][0]
    print(card)
    assert card["id"] == "tiny"
    assert card["model_type"] == "qwen2"
    assert card["max_position_embeddings"] == 1024
    assert card["max_model_len"] == 15 * 16  # 16 blocks, one kept back: below the 1024


def test_chat_template_flag_parses_and_bad_files_are_refused(tmp_path, model_dir):
    from transformers import AutoTokenizer

    args = build_parser(None).parse_args(["--chat-template", "/some/chat.jinja"])
    assert EngineConfig.from_args(args).chat_template == "/some/chat.jinja"
    assert EngineConfig.from_args(build_parser(None).parse_args([])).chat_template is None

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(ValueError, match=r"--chat-template .*missing\.jinja"):
        use_chat_template(tokenizer, str(tmp_path / "missing.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ValueError, match="not a valid Jinja template") as err:
        use_chat_template(tokenizer, str(broken))
    print(err.value)
