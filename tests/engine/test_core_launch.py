"""The core's socket folders: a gone server's are removed when the next one starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.core_launch import SOCKET_DIR_PREFIX, socket_dir


def test_a_gone_servers_socket_folder_is_removed_and_a_live_ones_kept():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    base = Path(tempfile.gettempdir())
    dead = Path(tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{dead_pid}-", dir=base))
    (dead / "requests").write_bytes(b"")  # what a socket leaves
    alive = Path(tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getppid()}-", dir=base))
    made = Path(socket_dir())
    try:
        print(dead, alive, made)
        assert not dead.exists()
        assert alive.exists()
        assert made.is_dir() and made.name.startswith(f"{SOCKET_DIR_PREFIX}{os.getpid()}-")
    finally:
        for folder in (alive, made):
            folder.rmdir()
