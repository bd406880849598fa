"""Reading the engine core process's outputs socket (for engine/process/client.py): on a thread
of its own, or, while an asyncio event loop serves the API (`on_loop`), on that loop.

On the loop, a Report goes from the socket to each request's queue with no thread in between:
ZMQ's I/O thread makes the socket's file descriptor readable, the loop reads every message
waiting, and each output is put straight into its queue (api/serving.py). From a thread of
its own, each output also has to cross to the loop (call_soon_threadsafe: a write to the
loop's wake-up pipe, a second thread woken, the GIL passed between the two), which on a
2-core machine is CPU taken from the core's compute threads at every token.

Only one of the two reads at a time (a ZMQ socket belongs to one thread): `on_loop` stops the
thread first, and starts it again when the loop is done (for the shutdown that follows).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec
import zmq

from engine.process.launch import POLL_MS
from engine.process.messages import FromCore


class OutputReader:
    def __init__(self, socket: zmq.Socket, decoder: msgspec.msgpack.Decoder,
                 handle: Callable[[FromCore], bool], core_gone: Callable[[], bool]) -> None:
        """`handle(message)` deals with one message and says whether more are to come (False
        after the last, Stopped). `core_gone()` is asked when the socket is quiet: True if
        the core process has exited (and it has dealt with that)."""
        self._socket = socket
        self._decoder = decoder
        self._handle = handle
        self._core_gone = core_gone
        self._done = False  # the last message came, or the core is gone: nothing to read
        self._thread: threading.Thread | None = None
        self._to_loop = threading.Event()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Read on a thread of its own (until `on_loop` takes over)."""
        self._to_loop.clear()
        self._thread = threading.Thread(target=self._run, name="engine-client", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread to read the last message (after the core was told to stop)."""
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    @contextmanager
    def on_loop(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """Read on `loop`, the caller's running loop, while the context is open."""
        if self._thread is not None:
            self._to_loop.set()
            self._thread.join()  # within POLL_MS
        fd = self._socket.getsockopt(zmq.FD)
        loop.add_reader(fd, self._readable)
        self._timer = loop.call_later(POLL_MS / 1000, self._tick, loop)
        self._readable()  # what came before: the descriptor signals only what comes next
        try:
            yield
        finally:
            loop.remove_reader(fd)
            self._timer.cancel()
            if not self._done:
                self.start()

    # --- on the loop -------------------------------------------------------------------

    def _readable(self) -> None:
        # ZMQ's descriptor is edge-triggered: read until nothing is left.
        while not self._done and self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            message = self._decoder.decode(self._socket.recv(zmq.NOBLOCK))
            self._done = not self._handle(message)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Every POLL_MS: has the core died? (Its last messages are read first.)"""
        self._readable()
        if not self._done and self._core_gone():
            self._done = True
        if not self._done:
            self._timer = loop.call_later(POLL_MS / 1000, self._tick, loop)

    # --- on the thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._done and not self._to_loop.is_set():
            if self._socket.poll(POLL_MS):
                self._done = not self._handle(self._decoder.decode(self._socket.recv()))
            elif self._core_gone():
                self._done = True
