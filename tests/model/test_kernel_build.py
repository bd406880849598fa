"""The kernels' build lock (model/kernels/build.py): a build that dies does not stop the next."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from model.kernels.build import (
    build_directory,
    build_lock,
    end_processes_working_in,
    module_name,
    processes_working_in,
)
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


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
         "from model.kernels.build import build_lock\n"
         f"with build_lock(Path({str(directory)!r})):\n"
         "    print('held', flush=True); time.sleep(60)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(directory / "nano-vllm.flock") as lock:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.kill()
            holder.wait()
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with its holder
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None,
                    reason="no C++ toolchain to build the kernels")
def outside_group(pids: list[int], group: int) -> list[int]:
    """Those of `pids` alive in a process group other than `group`."""
    found = []
    for pid in pids:
        try:
            if os.getpgid(pid) != group:
                found.append(pid)
        except ProcessLookupError:
            pass
    return found


def test_a_build_killed_midway_is_cleared_by_the_next(tmp_path, monkeypatch):
    """A server stopped while its first start compiles: PyTorch's lock file stays behind
    (before this lock, every later start waited on it for ever) and so do the compilers
    running then; the next build ends them and clears the file."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = build_directory(module_name())
    builder = subprocess.Popen([sys.executable, "-m", "model.kernels.build"], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # its own group: it and its ninja
    try:  # ninja itself works in the folder too, in the builder's group: wait for a compiler
        wait_for(lambda: outside_group(processes_working_in(directory), builder.pid),
                 timeout=120)
    finally:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.wait()
    try:
        assert (directory / "lock").exists()
        assert processes_working_in(directory)  # the compilers outlive the build that started them
        with build_lock(directory):
            assert not (directory / "lock").exists()
            assert not processes_working_in(directory)
    finally:
        end_processes_working_in(directory)

