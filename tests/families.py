"""Tiny random models of families the tests cannot fetch, each with its family's published
chat template (tests/data/templates/): Qwen3 (thinking, Hermes-style calls) and Llama 3
(JSON calls). The tokenizer is the default model's, with the family's tags added as tokens
of their own, as the families' tokenizers hold them; a random model writes any token, so
the tests steer it with budgets and grammars, never by what it would choose.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN3_TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # plain added tokens
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|python_tag|>"]
# Qwen3's thinking-only releases (2507) open the thinking in the prompt itself.
THINKING_ONLY = ("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}")


def save_family(family: str, folder: Path, model_dir: Path) -> Path:
    """A tiny random model of `family` ("qwen3", "qwen3-thinking" or "llama3") in `folder`,
    with the default model's tokenizer (from `model_dir`) and the family's template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if family.startswith("qwen3"):
        tokenizer.add_tokens(QWEN3_TAGS)
        template = (TEMPLATES / "qwen3.jinja").read_text()
        if family == "qwen3-thinking":
            template = template.replace(*THINKING_ONLY)
    else:
        tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIAL})
        tokenizer.bos_token = "<|begin_of_text|>"
        template = (TEMPLATES / "llama3.jinja").read_text()
    tokenizer.chat_template = template
    shape = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 max_position_embeddings=2048, tie_word_embeddings=True,
                 eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    config = (Qwen3Config(**shape, head_dim=32, rope_theta=1e6) if family.startswith("qwen3")
              else LlamaConfig(**shape, rope_theta=5e5))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
