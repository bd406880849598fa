"""The core's socket folders: those of a server that is gone are removed when the next one
starts, by their lock, which the kernel lets go of when the process holding it dies."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.process.launch import LOCK_NAME, SOCKET_DIR_PREFIX, socket_dir

HOLD = """
import sys, time
from engine.process.launch import socket_dir
folder, fd = socket_dir()
print(folder, flush=True)
time.sleep(float(sys.argv[1]))
"""
ROOT = Path(__file__).resolve().parents[2]


def holder(seconds: float) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(seconds)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_a_gone_servers_socket_folder_is_removed_and_a_live_ones_kept():
    live, live_dir = holder(60)
    gone, gone_dir = holder(0)  # (its own start found live's folder locked, and kept it)
    gone.wait()  # exited without removing its folder, as after SIGKILL
    unlocked = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))  # no lock file: not judged
    try:
        assert gone_dir.is_dir() and (gone_dir / LOCK_NAME).exists()
        made, fd = socket_dir()
        print(gone_dir, live_dir, made)
        assert not gone_dir.exists()
        assert live_dir.is_dir() and unlocked.is_dir()
        assert Path(made).is_dir() and Path(made).name.startswith(SOCKET_DIR_PREFIX)
        os.close(fd)
        Path(made, LOCK_NAME).unlink()
        Path(made).rmdir()
    finally:
        live.kill()
        live.wait()
        for proc in (gone, live):
            proc.stdout.close()
        unlocked.rmdir()
