"""What may be loaded at once when a server serves several models: the flags, and the memory
each model is reckoned to take before it is loaded.

A model's estimate is its weights' files plus its KV cache plus one engine process's own:

    weights  = the GGUF file's size, or the folder's *.safetensors (else *.gguf) sizes
    kv_cache = --num-blocks x 2 (K and V) x layers x 16 tokens x KV heads x head dim x dtype
               bytes (config.json says the shapes), or --kv-cache-memory's size, or its share
               of what is free once the weights are in (auto: 40% of it, at most 2 GiB)
               (0 for an embedding model, which keeps none)
    estimate = weights + kv_cache + PROCESS_BYTES

A model is loaded only while the estimates of those loaded, with its own, stay within
--models-memory (default: what is free when the server starts) and their number within
--max-loaded-models.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from kvcache.pool import BLOCK_SIZE, parse_memory

GIB = 1024**3
PROCESS_BYTES = 400 * 1024**2  # an engine core process's Python, PyTorch and kernels
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
AUTO_KV_FRACTION = 0.4  # engine/core.py's --kv-cache-memory auto ...
AUTO_KV_CEILING = 2 * GIB  # ... and its ceiling
DEFAULT_LOAD_TIMEOUT = 120.0


@dataclass(frozen=True)
class LoadPolicy:
    """The flags that decide which models are loaded, and for how long."""

    max_loaded: int | None = None  # most models loaded at once; None: no limit
    memory: int | None = None  # bytes the loaded models' estimates may sum to; None: free
    idle_unload: float | None = None  # seconds unused before a model is unloaded; None: never
    load_timeout: float = DEFAULT_LOAD_TIMEOUT  # a request waits this long for its model

    @property
    def limits_lifetime(self) -> bool:
        """Whether any flag was given that loads or unloads models while serving."""
        return (self.max_loaded is not None or self.memory is not None
                or self.idle_unload is not None)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--max-loaded-models", type=int, default=None, metavar="N",
                            help="with several --model: at most N loaded at once; loading "
                                 "one more unloads the least recently used idle one "
                                 "(default: no limit)")
        parser.add_argument("--models-memory", default=None, metavar="SIZE",
                            help="with several --model: the memory the loaded models' "
                                 "estimates (weights + KV cache + process) may take, e.g. "
                                 "8GiB (default: what is free when the server starts)")
        parser.add_argument("--idle-unload", type=float, default=None, metavar="S",
                            help="unload a model nobody has used for S seconds; its next "
                                 "request loads it again (default: never)")
        parser.add_argument("--model-load-timeout", type=float, default=DEFAULT_LOAD_TIMEOUT,
                            metavar="S",
                            help="how long a request waits for its model to load before a "
                                 f"503 with Retry-After (default: {DEFAULT_LOAD_TIMEOUT:g})")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadPolicy:
        """ValueError for a value that cannot work."""
        max_loaded = getattr(args, "max_loaded_models", None)
        if max_loaded is not None and max_loaded < 1:
            raise ValueError("--max-loaded-models must be at least 1")
        idle = getattr(args, "idle_unload", None)
        if idle is not None and idle <= 0:
            raise ValueError("--idle-unload must be above 0 seconds")
        timeout = getattr(args, "model_load_timeout", DEFAULT_LOAD_TIMEOUT)
        if timeout <= 0:
            raise ValueError("--model-load-timeout must be above 0 seconds")
        memory = getattr(args, "models_memory", None)
        return cls(max_loaded, parse_memory(memory) if memory else None, idle, timeout)


def weights_file_bytes(model_dir: Path) -> int:
    """The size of the files the weights load from."""
    if model_dir.is_file():
        return model_dir.stat().st_size
    files = list(model_dir.glob("*.safetensors")) or list(model_dir.glob("*.gguf"))
    return sum(f.stat().st_size for f in files)


def kv_block_bytes(model_dir: Path, dtype: str) -> int | None:
    """One block of 16 tokens of every layer's K and V, from config.json; None without one."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    heads = cfg.get("num_attention_heads", 1)
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // heads
    return (2 * cfg.get("num_hidden_layers", 0) * BLOCK_SIZE
            * cfg.get("num_key_value_heads", heads) * head_dim * DTYPE_BYTES.get(dtype, 4))


def is_encoder(model_dir: Path) -> bool:
    """An embedding model (a bidirectional encoder): it keeps no KV cache."""
    try:
        return bool(json.loads((model_dir / "config.json").read_text())
                    .get("use_bidirectional_attention"))
    except (OSError, ValueError):
        return False


def kv_cache_bytes(config: EngineConfig, model_dir: Path, weights: int, free: int | None) -> int:
    """The KV cache the engine will size for this model (engine/core.py's arithmetic); none
    for an embedding model."""
    if is_encoder(model_dir):
        return 0
    if config.num_blocks:
        block = kv_block_bytes(model_dir, config.dtype)
        if block is not None:
            return config.num_blocks * block
    text = config.kv_cache_memory.strip()
    if text != "auto" and not text.endswith("%"):
        return parse_memory(text)
    if free is None:
        return AUTO_KV_CEILING
    left = max(0, free - weights)
    if text == "auto":
        return min(int(left * AUTO_KV_FRACTION), AUTO_KV_CEILING)
    return int(left * float(text[:-1]) / 100)


def estimate_bytes(config: EngineConfig, model_dir: Path, free: int | None) -> int:
    """What the model is reckoned to take once loaded (the module's docstring)."""
    weights = weights_file_bytes(model_dir)
    return weights + kv_cache_bytes(config, model_dir, weights, free) + PROCESS_BYTES


def loaded_at_start(estimates: list[int], policy: LoadPolicy, budget: int | None) -> int:
    """How many of the models, in order, load at start: all of them, or as many as fit
    --max-loaded-models and the memory budget (the first always loads)."""
    count = len(estimates) if policy.max_loaded is None else min(policy.max_loaded,
                                                                 len(estimates))
    if budget is None:
        return count
    total = 0
    for k, estimate in enumerate(estimates[:count]):
        total += estimate
        if total > budget and k > 0:
            return k
    return count


def room_for(slot: Any, slots: list[Any], policy: LoadPolicy,
             budget: int | None) -> list[Any] | None:
    """The idle models to unload, least recently used first, so that `slot` (api/model_slot.py's
    ModelSlot) fits among those loaded or loading; None if it cannot fit even with every idle
    one gone (a model with requests in flight is never unloaded)."""
    kept = [s for s in slots if s is not slot and s.state in ("loaded", "loading")]
    idle = sorted((s for s in kept if s.idle), key=lambda s: s.last_used)
    victims: list[Any] = []

    def fits() -> bool:
        left = [s for s in kept if s not in victims]
        if policy.max_loaded is not None and len(left) + 1 > policy.max_loaded:
            return False
        return budget is None or sum(s.estimate for s in left) + slot.estimate <= budget

    while not fits():
        if not idle:
            return None
        victims.append(idle.pop(0))
    return victims


def gib(size: int | None) -> str:
    return "no limit" if size is None else f"{size / GIB:.2f} GiB"


def retry_seconds(seconds: float) -> int:
    """A Retry-After: whole seconds, at least 1."""
    return max(1, math.ceil(seconds))
