"""An engine from a model's name: the model and its tokenizer loaded, a BatchEngine around
them (engine/batch_engine.py), or an engine loop alone (engine/engine_loop.py).

`load_engine` is what server.py (in-process), deploy/replica.py and the benchmarks start
from, `load_engine_loop` the engine core process (engine/process/loop.py); `use_chat_template`
swaps in a --chat-template file's template.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.core import EngineCore, PagedEngineCore
from engine.engine_loop import EngineLoop
from model.llama import LlamaModel


def load_engine(config: EngineConfig,
                core_class: type[EngineCore] = PagedEngineCore) -> BatchEngine:
    """Load the model `config` names and its tokenizer (`load_model`), and build the
    in-process engine around a core of `core_class` (baseline_server.py passes its own)."""
    model, tokenizer = load_model(config)
    return BatchEngine(config, model, tokenizer, core_class)


def load_engine_loop(config: EngineConfig,
                     core_class: type[EngineCore] = PagedEngineCore) -> EngineLoop:
    """The same model and tokenizer, for an engine loop driven by its caller (the engine
    core process)."""
    model, tokenizer = load_model(config)
    return EngineLoop(config, model, tokenizer, core_class)


def load_model(config: EngineConfig) -> tuple[LlamaModel, PreTrainedTokenizerBase]:
    """The model `config` names (model/loader.py: found or prepared, in its --weights) and
    its tokenizer (with a --chat-template file's template)."""
    from model.gguf.source import load_tokenizer
    from model.loader import load

    loaded = load(config.model, weights=config.weights, activations=config.activations,
                  device=config.device, dtype=config.dtype, fused_ops=config.fused_ops,
                  matmul=config.matmul, lm_head=config.lm_head)
    tokenizer = load_tokenizer(loaded.path)
    if config.chat_template is not None:
        use_chat_template(tokenizer, config.chat_template)
    torch.set_grad_enabled(False)
    return loaded.model, tokenizer


def use_chat_template(tokenizer, path: str) -> None:
    """Replace the tokenizer's chat template with a --chat-template file's, refusing a file
    that cannot be read or does not compile (checked by rendering one user message)."""
    import jinja2

    try:
        tokenizer.chat_template = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: {exc.strerror or exc}") from exc
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                      add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template {path}: not a valid Jinja template "
                         f"(line {exc.lineno}: {exc.message})") from exc
