"""The engine core's OS process, as the API process owns it (engine/process/client.py's client).

`SpawnedCore` starts `python -m engine.process.loop` with the engine's config and the
addresses of its sockets, relays the child's stderr to this process's stderr and keeps its
last STDERR_LINES lines, waits for the core's Ready (EngineStartError, with those lines, if
the child exits first or takes too long), and stops it: told to by the client, waited for,
killed if it does not exit in time. What crosses the sockets is the client's business.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from engine.config import EngineConfig
from engine.process.messages import FromCore, Ready, encode_config

log = logging.getLogger("nano_vllm.engine")

ROOT = Path(__file__).resolve().parents[2]
POLL_MS = 100  # a wait on the core's messages notices a dead core within about this long
STDERR_LINES = 40  # of the core's stderr, kept for an error at start-up


SOCKET_DIR_PREFIX = "nano-vllm-core-"


LOCK_NAME = "in-use"


def socket_dir() -> tuple[str, int]:
    """A new folder (in the temporary directory) for the sockets to the core, and a file
    descriptor holding the folder's lock for as long as it is open (the caller closes it when
    it removes the folder). First the folders whose lock nobody holds are removed: a server
    killed with SIGKILL cannot remove its own, but the kernel lets go of its lock, in whatever
    container or PID namespace it ran."""
    for old in Path(tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}*"):
        if (old / LOCK_NAME).exists() and not locked(old / LOCK_NAME):
            shutil.rmtree(old, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX)
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return folder, fd


def locked(path: Path) -> bool:
    """Whether a live process holds the lock at `path`."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return True  # not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it any lock taken here


class EngineStartError(RuntimeError):
    """The engine core process did not come up."""


class SpawnedCore:
    def __init__(self, config: EngineConfig, addresses: dict[str, str], cpus: str | None,
                 core: str) -> None:
        """Start the core process: its engine core the class at `core` ("module:Class"),
        pinned to `cpus` (e.g. "0,1"; None: all), connecting to `addresses` (socket name to
        ZMQ address)."""
        argv = [sys.executable, "-m", "engine.process.loop", "--config",
                encode_config(config), "--core", core, "--parent", str(os.getpid()),
                *(["--cpus", cpus] if cpus else [])]
        for name, address in addresses.items():
            argv += [f"--{name}", address]
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self._tail: deque[str] = deque(maxlen=STDERR_LINES)
        self._proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": path},
                                      stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        threading.Thread(target=self._relay_stderr, name="core-stderr", daemon=True).start()

    def _relay_stderr(self) -> None:
        """The core's log lines go on to this process's stderr; the last few are kept."""
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.decode(errors="replace")
            self._tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    @property
    def stderr_tail(self) -> str:
        """The last STDERR_LINES lines the core wrote to its stderr."""
        return "".join(self._tail)

    def poll(self) -> int | None:
        """The exit status (negative: the signal that killed it), None while it runs."""
        return self._proc.poll()

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        """The exit status once it has exited; subprocess.TimeoutExpired after `timeout`."""
        return self._proc.wait(timeout)

    def wait_ready(self, receive: Callable[[int], FromCore | None], timeout: float) -> Ready:
        """The core's Ready, from `receive` (the next message within so many ms, or None);
        EngineStartError if the process exits first or `timeout` seconds pass (it is
        killed then)."""
        deadline = time.monotonic() + timeout
        while True:
            message = receive(POLL_MS)
            if isinstance(message, Ready):
                return message
            code = self.poll()
            if code is not None or time.monotonic() > deadline:
                if code is None:
                    self.kill()
                    self.wait()
                time.sleep(0.2)  # the last of its stderr
                why = (f"exited with status {code}" if code is not None
                       else f"did not load the model within {timeout:g} s")
                raise EngineStartError(f"the engine core process {why}; its last output:\n"
                                       + self.stderr_tail)

    def stop(self, timeout: float) -> int:
        """Wait for the process (told to stop) to exit, killing it after `timeout` seconds;
        its exit status."""
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the engine core process did not stop: killing it")
            self.kill()
            return self.wait()
