"""A checkpoint (a config and tensors under Hugging Face's names) and the one walk that loads
it into a model, module by module, in a weight format.

The architecture (model/registry.py) says which checkpoint modules each of our modules is
made of; the weight format (`WeightFormat`: model/weights/dense.py, gguf_format.py and
int8.py) turns those tensors into the module that runs:
- a linear layer (`Linear`, or `BiasedLinear` with its biases) gets its parts' weights, in
  the order of the fused output, and returns the module to put in its place;
- the embedding and the LM head are handed over together (a tied head is the embedding,
  and a quantized format shares one set of codes between them);
- every other module with weights (the norms) gets its tensors assigned as they are. With one
  part, each parameter takes the part's tensor of the same name; with several (QKNorm's
  q_norm and k_norm), each parameter in turn takes a part's `weight`.

A tensor the model needs and the checkpoint lacks stops the load with its name; what the
model does not use (a tied folder's copy of lm_head.weight) is left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import BiasedLinear, Linear
from model.registry import CHECKPOINT_PREFIX, Architecture
from model.weights.blocks import BlockTensor

CheckpointTensor = Tensor | BlockTensor  # dense, or a GGUF file's own codes
EMBEDDING, LM_HEAD = "embed_tokens", "lm_head"


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, CheckpointTensor]  # Hugging Face names
    source: Path  # what it was read from, for error messages


class WeightFormat(Protocol):
    """A weight format: what it reads from a source, how it builds the modules that hold
    weights (see the module docstring), and what it does to the filled model."""

    def read(self, path: Path) -> Checkpoint: ...

    def check(self, cfg: ModelConfig) -> None:
        """Refuse (before any module is built) a model this format cannot run."""

    def finish(self, model: nn.Module) -> nn.Module:
        """The filled model, ready to run: on its device, kernels switched in."""

    def linear(self, name: str, module: Linear | BiasedLinear, weights: list[CheckpointTensor],
               biases: list[CheckpointTensor] | None) -> nn.Module: ...

    def embedding_and_head(self, model: nn.Module, embedding: CheckpointTensor,
                           head: CheckpointTensor | None) -> None: ...


def read_hf_weights(model_dir: Path) -> dict[str, Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    weights: dict[str, Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                weights[name] = f.get_tensor(name)
    return weights


def read_checkpoint(model_path: Path) -> Checkpoint:
    """A Hugging Face folder's config and weights, or a GGUF file's (its metadata as the
    config, its tensors dequantized to fp32 under Hugging Face's names)."""
    if model_path.is_file():
        from model.gguf.checkpoint import read_gguf_checkpoint

        gguf = read_gguf_checkpoint(model_path)
        return Checkpoint(gguf.config, gguf.hf_weights, model_path)
    return Checkpoint(ModelConfig.from_dir(model_path), with_prefix(read_hf_weights(model_path)),
                      model_path)


def with_prefix(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A bare backbone's tensors (a sentence-transformers folder's `Gemma3TextModel` saves
    `embed_tokens.weight`, not `model.embed_tokens.weight`) under the names of a whole model."""
    if any(name.startswith(CHECKPOINT_PREFIX) for name in weights):
        return weights
    return {f"{CHECKPOINT_PREFIX}{name}": t for name, t in weights.items()}


def weight_units(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """Our modules that load tensors, by name: linear layers (whole, a BiasedLinear with its
    inner Linear) and the others that hold parameters of their own; the embedding and the LM
    head are left to the caller."""
    for name, child in module.named_children():
        full = f"{prefix}{name}"
        if full in (EMBEDDING, LM_HEAD):
            continue
        owns_weights = next(child.parameters(recurse=False), None) is not None
        if isinstance(child, Linear | BiasedLinear) or owns_weights:
            yield full, child
        else:
            yield from weight_units(child, f"{full}.")


def load_weights(model: nn.Module, arch: Architecture, checkpoint: Checkpoint,
                 fmt: WeightFormat) -> None:
    """Fill (or replace) every weight-holding module of `model` from the checkpoint, in
    `fmt`; the checkpoint's tensors are dropped as they are used."""
    cfg, tensors = checkpoint.config, checkpoint.tensors

    def take(name: str, keep: bool = False) -> CheckpointTensor:
        if name not in tensors:
            raise ValueError(f"{checkpoint.source}: no tensor {name} in the checkpoint")
        return tensors[name] if keep else tensors.pop(name)

    embedding_name = f"{arch.checkpoint_modules(EMBEDDING, cfg)[0]}.weight"
    head_name = f"{arch.checkpoint_modules(LM_HEAD, cfg)[0]}.weight"
    embedding = take(embedding_name, keep=True)
    # An encoder has no head (model/gemma3.py); a tied head is the embedding.
    needs_head = getattr(model, LM_HEAD, None) is not None and not cfg.tie_word_embeddings
    head = take(head_name, keep=True) if needs_head else None
    fmt.embedding_and_head(model, embedding, head)
    tensors.pop(embedding_name, None)
    tensors.pop("lm_head.weight", None)  # the head's, or a tied folder's unused copy
    for name, module in list(weight_units(model)):
        parts = arch.checkpoint_modules(name, cfg)
        if isinstance(module, Linear | BiasedLinear):
            weights = [take(f"{part}.weight") for part in parts]
            biases = ([take(f"{part}.bias") for part in parts]
                      if isinstance(module, BiasedLinear) else None)
            replace(model, name, fmt.linear(name, module, weights, biases))
        else:
            load_dense(module, name, parts, take)


def load_dense(module: nn.Module, name: str, parts: list[str], take) -> None:
    """Assign a norm's parameters from its checkpoint parts, as they are."""
    params = [p for p, _ in module.named_parameters(recurse=False)]
    if len(parts) == 1:
        sources = [f"{parts[0]}.{p}" for p in params]
    elif len(parts) == len(params):
        sources = [f"{part}.weight" for part in parts]
    else:
        raise ValueError(f"{name}: {len(params)} parameters, {len(parts)} checkpoint parts")
    state = {p: take(source) for p, source in zip(params, sources, strict=True)}
    module.load_state_dict(state, assign=True, strict=True)


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def build_model(checkpoint: Checkpoint, arch: Architecture, fmt: WeightFormat) -> nn.Module:
    """The architecture's model, built on the meta device (no time spent initialising what
    is overwritten) and filled from the checkpoint in `fmt`."""
    with torch.device("meta"):
        model = arch.model_class(checkpoint.config)
    load_weights(model, arch, checkpoint, fmt)
    missing = [name for name, t in [*model.named_parameters(), *model.named_buffers()]
               if t.is_meta]
    if missing:
        raise ValueError(f"{checkpoint.source}: no weights for {', '.join(missing[:8])}")
    return model
