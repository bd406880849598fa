"""The kernels' build lock (model/cpu_kernel.py): a build that dies does not stop the next."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model.cpu_kernel import build_directory, build_lock, module_name

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_build_killed_midway_leaves_a_lock_file_that_the_next_build_clears(tmp_path):
    """A server stopped while its first start compiles: PyTorch's lock file stays behind
    (before this lock, every later start waited on it for ever); the next build clears it."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    builder = subprocess.Popen([sys.executable, "-m", "model.cpu_kernel"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # its own group: ninja and compilers
    os.environ["TORCH_EXTENSIONS_DIR"] = str(tmp_path)
    try:
        directory = build_directory(module_name())
    finally:
        del os.environ["TORCH_EXTENSIONS_DIR"]
    try:
        assert wait_until(lambda: (directory / "lock").exists(), 60), "the build never began"
    finally:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.wait()
        end_compilers_writing_to(tmp_path)
    assert wait_until(lambda: not group_alive(builder.pid), 10)
    assert (directory / "lock").exists()
    with build_lock(directory):
        assert not (directory / "lock").exists()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def end_compilers_writing_to(folder: Path) -> None:
    """ninja starts each compiler in a process group of its own: killing the build's group
    leaves them to finish their file; end those that work in `folder` now."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            pass
