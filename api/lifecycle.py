"""The server process's life: a graceful drain on SIGTERM, an exit when the engine dies.

uvicorn on SIGTERM stops listening at once, so a load balancer's health check and new
clients see refused connections while requests in flight are cut off after its timeout.
`ServingProcess` does it the other way round:

1. SIGTERM (or SIGINT): the engine stops accepting. /health answers 503 and every new
   generation request 503, while the port stays open for requests in flight.
2. Those finish, for up to --shutdown-timeout seconds; then whatever still runs is ended
   with an error (an error event on a stream, a 503 otherwise) and its blocks freed.
3. uvicorn then shuts down as usual (responses in flight are sent), and the process exits
   with status 0. A second signal stops at once.

If the engine thread (or with --engine-process the engine core process) dies, every request
in flight has already ended with an error and new ones get 503 (engine/batch_engine.py,
engine/process/client.py). By default the process then exits with status
ENGINE_FAILURE_EXIT_CODE, so that a supervisor (systemd, Kubernetes) restarts it;
--no-exit-on-engine-failure keeps it up, answering 503, for someone to look at.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from api.engine_client import ServedEngine

log = logging.getLogger("nano_vllm.server")

ENGINE_FAILURE_EXIT_CODE = 70  # EX_SOFTWARE (sysexits.h): an internal software error
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
POLL_SECONDS = 0.05


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT,
                        help="on SIGTERM, let requests in flight finish for this many seconds, "
                             "then end them with an error (new ones get 503 meanwhile)")
    parser.add_argument("--exit-on-engine-failure", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="if the engine dies (its core process, or its thread with "
                             "--no-engine-process), exit with status "
                             f"{ENGINE_FAILURE_EXIT_CODE} so a supervisor restarts the server "
                             "(default); --no-exit-on-engine-failure stays up answering 503")


class ServingProcess(uvicorn.Server):
    """uvicorn's server with the drain and the failure exit above; `exit_code` is what the
    process should exit with once `run()` returns."""

    def __init__(self, config: uvicorn.Config, engine: ServedEngine, shutdown_timeout: float,
                 exit_on_engine_failure: bool) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = 0
        self._draining = False
        if exit_on_engine_failure:
            engine.on_failure(self._on_engine_failure)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: drain; a second one: stop now. (uvicorn's own handler would also
        re-raise the signal after shutting down, ending the process by the signal.)"""
        if self._draining:
            log.warning("second signal: stopping without waiting")
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        engine = self.engine
        engine.stop_accepting("The server is shutting down.")
        log.info("draining: %d requests in flight, up to %g s", engine.num_in_flight,
                 self.shutdown_timeout)
        if not wait_until(lambda: engine.num_in_flight == 0, self.shutdown_timeout):
            log.warning("shutdown timeout: ending the %d requests still in flight",
                        engine.num_in_flight)
            engine.abort_all(f"The server shut down before this request finished "
                             f"(--shutdown-timeout {self.shutdown_timeout:g} s).")
            wait_until(lambda: engine.num_in_flight == 0, 10.0)
        self.should_exit = True  # uvicorn now sends what is in flight and stops

    def _on_engine_failure(self) -> None:  # on the dying engine thread
        log.critical("the engine failed: exiting with status %d", ENGINE_FAILURE_EXIT_CODE)
        self.exit_code = ENGINE_FAILURE_EXIT_CODE
        self.should_exit = True


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True
