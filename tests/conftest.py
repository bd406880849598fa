"""Shared fixtures: one prepared model folder, one loaded model per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.llama import LlamaModel
from model.loader import load_model
from model.prepare import prepare_default_model

# Our forward pass against Hugging Face's on the same fp32 weights. Both run the same
# sequence of fp32 kernels, so the observed difference is 0 or a few float32 ulps;
# 1e-4 leaves room for a different SDPA kernel choice at other lengths, and is still
# ~1000x smaller than what a real bug (a wrong RoPE theta, say) produces.
LOGITS_ATOL = 1e-4

PROMPTS = [
    "The cat sat on the",
    "Paris is the capital of",
    "In 1969, Neil Armstrong became the first person to walk on the moon. Later in his life, he",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return prepare_default_model()


@pytest.fixture(scope="session")
def model(model_dir: Path) -> LlamaModel:
    torch.manual_seed(0)
    return load_model(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
