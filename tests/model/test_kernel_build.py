"""The kernels' build lock and the background build of a first start (model/cpu_kernel.py)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.config import EngineConfig
from model import cpu_kernel
from model.cpu_kernel import build_directory, build_in_background, build_lock, module_name
from model.prepare import ModelPreparationError

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_dead_builders_lock_file_is_cleared(tmp_path):
    """PyTorch's lock file, left by a builder that died, no longer stops the next build."""
    directory = tmp_path / "nano_vllm_cpu_kernels_x"
    directory.mkdir()
    (directory / "lock").touch()
    with build_lock(directory):
        assert not (directory / "lock").exists()


def test_the_lock_is_held_until_its_holder_dies(tmp_path):
    directory = tmp_path / "nano_vllm_cpu_kernels_x"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from model.cpu_kernel import build_lock\n"
         f"with build_lock(Path({str(directory)!r})):\n"
         "    print('held', flush=True); time.sleep(60)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(tmp_path / f"{directory.name}.lock") as lock:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.kill()
            holder.wait()
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with its holder
    finally:
        holder.kill()
        holder.wait()


def test_no_background_build_once_the_module_is_built():
    if cpu_kernel.load_cpu_kernels() is None:
        pytest.skip(f"the kernels are not built here: {cpu_kernel.cpu_kernels_error()}")
    assert build_in_background() is None


def test_a_background_build_ends_with_its_parent_and_its_lock_file_is_cleared(tmp_path):
    """A server killed during its first start: its compile ends too, and the lock file that
    PyTorch's builder leaves behind is cleared by the next build."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", "import time; from model.cpu_kernel import build_in_background\n"
         "print(build_in_background().pid, flush=True); time.sleep(120)"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    builder = int(parent.stdout.readline())
    os.environ["TORCH_EXTENSIONS_DIR"] = str(tmp_path)
    try:
        directory = build_directory(module_name())
    finally:
        del os.environ["TORCH_EXTENSIONS_DIR"]
    try:
        assert wait_until(lambda: (directory / "lock").exists(), 60), "the build never began"
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not alive(builder), 10), "the build outlived its parent"
        assert wait_until(lambda: not group_alive(builder), 10), "its compilers live on"
    finally:
        parent.kill()
        parent.wait()
        if group_alive(builder):
            os.killpg(builder, signal.SIGKILL)
    assert (directory / "lock").exists()  # what PyTorch's own lock leaves behind
    with build_lock(directory):
        assert not (directory / "lock").exists()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_failed_start_stops_the_background_build(monkeypatch):
    """The model cannot be prepared: the build started beside it is stopped, not left."""
    from engine.core_client import EngineProcessClient

    started: list[subprocess.Popen] = []

    def fake_build() -> subprocess.Popen:
        started.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        return started[-1]

    monkeypatch.setattr(cpu_kernel, "build_in_background", fake_build)
    with pytest.raises(ModelPreparationError):
        EngineProcessClient(EngineConfig(model="/no/such/model", device="cpu"))
    [builder] = started
    assert builder.poll() is not None
