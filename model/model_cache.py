"""Where fetched and prepared models live, and what fetching them shares: the error that
says what to do, the progress line, a file's sha256. model/prepare.py (the default model)
and model/gguf/source.py (named GGUF releases) both build on it."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


class ModelPreparationError(RuntimeError):
    """The default model could not be prepared; the message says what to do."""


def cache_dir() -> Path:
    """Where prepared models live: $NANO_VLLM_CACHE, else ~/.cache/nano-vllm."""
    return Path(os.environ.get("NANO_VLLM_CACHE", Path.home() / ".cache" / "nano-vllm"))


def log(message: str) -> None:
    print(f"[prepare] {message}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
