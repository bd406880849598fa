"""Architectures by the `model_type` of a Hugging Face config.json.

Adding one is a new file with its model class and its `convert_hf_weights`, a line here,
and its entry (with what it refuses) in model/config.py; the loader, the engine and the
runner need no edits as long as the model takes (input_ids, positions, attention,
logits_indices) like model/llama.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from model import gemma3, llama, qwen2, qwen3
from model.config import ModelConfig


@dataclass(frozen=True)
class Architecture:
    model_class: Callable[[ModelConfig], nn.Module]
    convert_hf_weights: Callable[[dict[str, Tensor], ModelConfig], dict[str, Tensor]]


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(llama.LlamaModel, llama.convert_hf_weights),
    "qwen2": Architecture(qwen2.Qwen2Model, qwen2.convert_hf_weights),
    "qwen3": Architecture(qwen3.Qwen3Model, qwen3.convert_hf_weights),
    "gemma3_text": Architecture(gemma3.Gemma3Model, gemma3.convert_hf_weights),
}


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type {model_type!r} is not supported; this server runs: "
                         f"{', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[model_type]
