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


EMBEDDING_WINDOW = 8  # the tiny encoder's sliding window: a token sees 4 either side


def save_embedding_model(folder: Path, model_dir: Path, pooling: str = "mean") -> Path:
    """A tiny random bidirectional Gemma 3 as a sentence-transformers folder, shaped like
    EmbeddingGemma (sliding and full layers, one K/V head, a Dense pair, Normalize), with the
    default model's tokenizer; `pooling` is "mean", "cls" or "lasttoken"."""
    import json

    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Gemma3TextConfig, Gemma3TextModel

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=EMBEDDING_WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=512, use_bidirectional_attention=True, query_pre_attn_scalar=32,
        pad_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Gemma3TextModel(config)
    with torch.no_grad():  # Gemma's norms start at zero gain offsets: make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    modules = [("0", "", "Transformer"), ("1", "1_Pooling", "Pooling"),
               ("2", "2_Dense", "Dense"), ("3", "3_Dense", "Dense"),
               ("4", "4_Normalize", "Normalize")]
    (folder / "modules.json").write_text(json.dumps([
        {"idx": i, "name": name, "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (name, path, kind) in enumerate(modules)]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "include_prompt": True,
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_lasttoken": pooling == "lasttoken"}))
    for path, (n_in, n_out) in (("2_Dense", (64, 96)), ("3_Dense", (96, 48))):
        (folder / path).mkdir()
        (folder / path / "config.json").write_text(json.dumps({
            "in_features": n_in, "out_features": n_out, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        save_file({"linear.weight": torch.randn(n_out, n_in) / n_in ** 0.5},
                  folder / path / "model.safetensors")
    (folder / "4_Normalize").mkdir()
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "prompts": {"query": "task: search result | query: ", "document": "title: none | text: "},
        "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    return folder
