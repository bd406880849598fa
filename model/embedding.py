"""An embedding model: an encoder (a bidirectional Gemma 3, model/gemma3.py) and what a
sentence-transformers folder declares after it in modules.json.

    tokens -> encoder (every token sees its whole sequence) -> hidden states
           -> Pooling (mean, CLS or last token) -> Dense ... -> Normalize -> the embedding

Several texts run as one batch, packed one after another with no padding
(model/attention/bidirectional.py keeps them apart). The folder's
config_sentence_transformers.json names its task prompts ("query", "document", ...), which
the API puts before a text when a request asks for one; sentence_bert_config.json its
longest input. Matryoshka sizes a model was trained for (EmbeddingGemma: 768, 512, 256, 128)
are not in its files: a fetched release writes them to nano_vllm.json in its folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

from model.attention.bidirectional import PackedBidirectionalAttention
from model.config import ModelConfig

POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_lasttoken": "last"}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": nn.Identity,
               "torch.nn.modules.activation.Tanh": nn.Tanh}
MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclass(frozen=True)
class EmbeddingInfo:
    """What the API needs to know of an embedding model."""

    dimensions: int  # of the full embedding
    matryoshka_dimensions: tuple[int, ...]  # sizes it may be truncated to (the full one first)
    prompts: dict[str, str] = field(default_factory=dict)  # task name -> text put before
    default_prompt_name: str | None = None
    max_seq_length: int | None = None  # tokens of one input, its prompt included
    normalized: bool = True


class EmbeddingModel(nn.Module):
    """An encoder and its sentence-transformers head; `embed` is the whole forward pass."""

    def __init__(self, encoder: nn.Module, pooling: str, dense: list[nn.Module],
                 normalize: bool, info: EmbeddingInfo) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.dense = nn.Sequential(*dense)
        self.normalize = normalize
        self.info = info

    @property
    def cfg(self) -> ModelConfig:
        return self.encoder.cfg

    def embed(self, sequences: list[list[int]]) -> Tensor:
        """One embedding per token sequence, [len(sequences), dimensions], in fp32."""
        lengths = [len(s) for s in sequences]
        device = next(self.encoder.parameters()).device
        input_ids = torch.tensor([t for s in sequences for t in s], device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        hidden = self.encoder.hidden_states(input_ids, positions,
                                            PackedBidirectionalAttention(lengths))
        pooled = self.pool(hidden.float(), lengths)
        out = self.dense(pooled.to(self.dense_dtype())).float()
        return F.normalize(out, dim=-1) if self.normalize else out

    def pool(self, hidden: Tensor, lengths: list[int]) -> Tensor:
        ends = torch.tensor(lengths, device=hidden.device).cumsum(0)
        if self.pooling == "cls":
            return hidden[ends - torch.tensor(lengths, device=hidden.device)]
        if self.pooling == "last":
            return hidden[ends - 1]
        owner = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device),
                                        torch.tensor(lengths, device=hidden.device))
        sums = torch.zeros(len(lengths), hidden.shape[-1], device=hidden.device,
                           dtype=hidden.dtype).index_add_(0, owner, hidden)
        return sums / torch.tensor(lengths, device=hidden.device, dtype=hidden.dtype)[:, None]

    def dense_dtype(self) -> torch.dtype:
        first = next(self.dense.parameters(), None)
        return torch.float32 if first is None else first.dtype


def is_sentence_transformers(path: Path) -> bool:
    return path.is_dir() and (path / "modules.json").is_file()


def wrap_encoder(encoder: nn.Module, folder: Path) -> EmbeddingModel:
    """The folder's modules.json built around a loaded encoder (its Transformer module).

    Refuses, naming it, a module or an option this server does not run."""
    modules = json.loads((folder / "modules.json").read_text())
    pooling, dense, normalize = None, [], False
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind = module["type"].rpartition(".")[2]
        if kind not in MODULE_KINDS:
            raise ValueError(f"{folder}: sentence-transformers module {module['type']} is not "
                             f"supported (this server runs {', '.join(MODULE_KINDS)})")
        path = folder / module.get("path", "")
        if kind == "Pooling":
            pooling = read_pooling(path)
        elif kind == "Dense":
            dense.append(read_dense(path))
        elif kind == "Normalize":
            normalize = True
    if pooling is None:
        raise ValueError(f"{folder}: modules.json has no Pooling module")
    if not encoder.cfg.bidirectional:
        raise ValueError(f"{folder}: its encoder's config does not set "
                         "use_bidirectional_attention; only bidirectional encoders are served "
                         "as embedding models")
    dtype = encoder.norm.weight.dtype
    dense = [d.to(dtype) for d in dense]
    width = dense[-1][0].out_features if dense else encoder.cfg.hidden_size
    return EmbeddingModel(encoder, pooling, dense, normalize, read_info(folder, width, normalize))


def read_pooling(path: Path) -> str:
    config = json.loads((path / "config.json").read_text())
    modes = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    others = [key for key, on in config.items()
              if key.startswith("pooling_mode_") and on and key not in POOLING_MODES]
    if others or len(modes) != 1:
        raise ValueError(f"{path}: pooling {others or modes} is not supported; one of "
                         f"{', '.join(POOLING_MODES)} must be set")
    if config.get("include_prompt") is False:
        raise ValueError(f"{path}: include_prompt false (a prompt left out of the pooling) is "
                         "not supported")
    return modes[0]


def read_dense(path: Path) -> nn.Sequential:
    """A Dense module: Linear (its bias if it has one) then its activation."""
    config = json.loads((path / "config.json").read_text())
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{path}: Dense activation {activation} is not supported (one of "
                         f"{', '.join(ACTIVATIONS)})")
    linear = nn.Linear(config["in_features"], config["out_features"],
                       bias=config.get("bias", True))
    weights = load_file(path / "model.safetensors")
    state = {name.removeprefix("linear."): t for name, t in weights.items()}
    linear.load_state_dict(state, strict=True)
    return nn.Sequential(linear, ACTIVATIONS[activation]()).eval().requires_grad_(False)


def read_info(folder: Path, width: int, normalized: bool) -> EmbeddingInfo:
    def read(name: str) -> dict:
        file = folder / name
        return json.loads(file.read_text()) if file.is_file() else {}

    st_config, bert_config, ours = (read("config_sentence_transformers.json"),
                                    read("sentence_bert_config.json"), read("nano_vllm.json"))
    sizes = [width] + [d for d in ours.get("matryoshka_dimensions", []) if d != width]
    return EmbeddingInfo(dimensions=width, matryoshka_dimensions=tuple(sizes),
                         prompts=dict(st_config.get("prompts") or {}),
                         default_prompt_name=st_config.get("default_prompt_name"),
                         max_seq_length=bert_config.get("max_seq_length"),
                         normalized=normalized)
