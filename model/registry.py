"""Architectures by the `model_type` of a Hugging Face config.json, and how a checkpoint's
tensor names map onto each one's modules.

Our modules are named as Hugging Face's, without the `model.` prefix, except where one of our
modules fuses several of the checkpoint's: each architecture declares those in
`packed_modules` (our module -> the checkpoint modules it is made of, in order along its
output), e.g. `qkv_proj` <- `q_proj`, `k_proj`, `v_proj`. A tied LM head is read from the
embedding. model/checkpoint.py walks a model's modules with this mapping; nothing else
knows checkpoint names.

Adding an architecture is a new file with its model class and its `PACKED_MODULES`, a line
here, and its entry (with what it refuses) in model/config.py; the loader, the engine and
the runner need no edits as long as the model takes (input_ids, positions, attention,
logits_indices) like model/llama.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from model import gemma3, llama, qwen2, qwen3
from model.config import ModelConfig

CHECKPOINT_PREFIX = "model."  # Hugging Face's name of the decoder (all but the LM head)


@dataclass(frozen=True)
class Architecture:
    model_class: Callable[[ModelConfig], nn.Module]
    packed_modules: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def checkpoint_modules(self, name: str, cfg: ModelConfig) -> list[str]:
        """The checkpoint's modules (Hugging Face names) that our module `name` is made of."""
        if name == "lm_head":
            return [f"{CHECKPOINT_PREFIX}embed_tokens" if cfg.tie_word_embeddings else "lm_head"]
        parent, _, leaf = name.rpartition(".")
        prefix = f"{CHECKPOINT_PREFIX}{parent}." if parent else CHECKPOINT_PREFIX
        return [prefix + part for part in self.packed_modules.get(leaf, (leaf,))]


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(llama.LlamaModel, llama.PACKED_MODULES),
    "qwen2": Architecture(qwen2.Qwen2Model, qwen2.PACKED_MODULES),
    "qwen3": Architecture(qwen3.Qwen3Model, qwen3.PACKED_MODULES),
    "gemma3_text": Architecture(gemma3.Gemma3Model, gemma3.PACKED_MODULES),
}


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type {model_type!r} is not supported; this server runs: "
                         f"{', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[model_type]
