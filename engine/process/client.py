"""The API process's side of an engine core in its own process (`server.py --engine-process`).

`EngineProcessClient` is what the API and the server's lifecycle use of a BatchEngine
(api/engine_client.py's EngineClient, and the drain and failure hooks of api/lifecycle.py),
with the engine in engine/process/loop.py. This process loads only the tokenizer; the core's
OS process (started, its stderr relayed, waited for until Ready, stopped or killed) is
engine/process/launch.py's SpawnedCore, and this module speaks the protocol over its sockets.

- Admission happens here, synchronously, with the check BatchEngine itself runs
  (engine/admission.py's check_line) over the core's counts after its last step plus the
  requests sent since that the core had not yet taken in; the core queues what it is sent.
- Outputs come back in one Report per step, as token ids, read on the API's event loop while
  it runs (else on a thread of their own; engine/process/reader.py) and handed to
  engine/text_outputs.py's TextOutputs, which makes each sample's text, finds its stop
  strings (telling the core to end a sample one ended: EndSample) and calls each request's
  `on_output`; and it mirrors the core's counts.
- /metrics asks the core for its Prometheus text (the core's counters, exactly as they
  stand once the outputs received so far were sent), and adds the finished requests by
  reason, counted here.
- The dashboard reads the snapshots the core sends while someone watches, and asks the
  core for a cached-free block's content (engine/process/dashboard.py).
- If the core process dies, every request in flight ends with an error (ENGINE_FAILED),
  new ones get EngineUnavailableError, and the `on_failure` callbacks run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import threading
import time
from collections import deque
from contextlib import AbstractContextManager
from dataclasses import replace

import msgspec
import zmq

from engine.admission import EngineUnavailableError, check_line, retry_seconds
from engine.config import EngineConfig
from engine.core import EngineStats
from engine.front import EngineFront, ModelLimits
from engine.metrics import FrontMetrics
from engine.process.dashboard import ReceivedSnapshots
from engine.process.launch import (
    POLL_MS,
    ROOT,
    STDERR_LINES,
    EngineStartError,
    SpawnedCore,
    socket_dir,
)
from engine.process.loop import PAGED_CORE
from engine.process.messages import (
    Abort,
    AbortAll,
    AddRequest,
    BlockAnswer,
    CoreState,
    EndSample,
    Failed,
    FromCore,
    GrammarMsg,
    Report,
    Shutdown,
    Snapshot,
    Stopped,
    ToCore,
    open_socket,
)
from engine.process.reader import OutputReader
from engine.request import Request
from engine.snapshot import BLOCK_QUERY_TIMEOUT, CachedBlock

# Imported from here, some of them engine/process/launch.py's.
__all__ = ["METRICS_TIMEOUT", "POLL_MS", "ROOT", "START_TIMEOUT", "STDERR_LINES", "STOP_TIMEOUT",
           "EngineProcessClient", "EngineStartError"]

log = logging.getLogger("nano_vllm.engine")

START_TIMEOUT = 600.0  # seconds for the core to load the model (a first start compiles kernels)
STOP_TIMEOUT = 10.0  # seconds for the core to stop when told, before it is killed
METRICS_TIMEOUT = 2.0  # seconds for the core to answer a metrics query
SEND_RETRY_SECONDS = 0.001  # while the core's line of messages is full


class EngineProcessClient(EngineFront):
    def __init__(self, config: EngineConfig, cpus: str | None = None,
                 start_timeout: float = START_TIMEOUT, core: str = PAGED_CORE) -> None:
        """Start the core process (pinned to `cpus`, e.g. "0,1"; default all; its engine
        core the class at `core`, "module:Class") and wait until it has loaded the model;
        EngineStartError if it exits or takes too long."""
        from model.gguf.source import load_tokenizer
        from model.prepare import resolve_model_dir

        model_dir = resolve_model_dir(config.model)  # prepared here once, found by the core
        # The lock also guards the requests socket and the fields below.
        super().__init__(config, load_tokenizer(model_dir), threading.Lock(), self._end_sample)
        self.metrics = FrontMetrics(self.render_metrics, self.texts.finishes)
        self._unacked: deque[tuple[int, int]] = deque()  # (seq, prompt tokens) not taken in
        self._seq = 0
        self._failure: str | None = None  # the core's own account of its death
        self._closing = False
        self._shut_down = False
        self._metrics_lock = threading.Lock()
        self._metrics_query = 0
        self._last_metrics = b""
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromCore)
        self._dir, self._dir_lock = socket_dir()
        self._context = zmq.Context()
        addresses = {name: f"ipc://{self._dir}/{name}" for name in ("requests", "outputs",
                                                                    "metrics")}
        self._requests = self._bind(zmq.PUSH, addresses["requests"])
        self._outputs = self._bind(zmq.PULL, addresses["outputs"])
        self._metrics = self._bind(zmq.DEALER, addresses["metrics"])
        self._process = SpawnedCore(config, addresses, cpus, core)
        try:
            ready = self._process.wait_ready(self._receive_one, start_timeout)
        except BaseException:  # it failed, or the server was told to stop (KeyboardInterrupt)
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            self._close_sockets()
            raise
        self.core_pid = ready.pid
        self.limits = ModelLimits(ready.max_tokens_per_request, ready.model_type,
                                  ready.max_position_embeddings, ready.embedding)
        self._description = ready.description
        self._state = ready.state
        # The dashboard's view; None for a core with no pool to show (the baseline's).
        self.snapshots = (ReceivedSnapshots(self._send_now, self.metrics.dashboard_totals)
                          if ready.dashboard else None)
        self._reader = OutputReader(self._outputs, self._decoder, self._handle, self._core_gone)

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        return open_socket(self._context, kind, address, bind=True, linger_ms=0)

    def _receive_one(self, timeout_ms: int) -> FromCore | None:
        """The core's next message, if one comes within `timeout_ms`."""
        if self._outputs.poll(timeout_ms):
            return self._decoder.decode(self._outputs.recv())
        return None

    # --- what the API and the lifecycle use ------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self._process.poll() is None and self._failure is None

    @property
    def unavailable_reason(self) -> str | None:
        return self._unavailable

    def describe(self) -> str:
        return f"{self._description}; engine core in process {self.core_pid}"

    def stats(self) -> EngineStats:
        """The core's counts after its last step, with the requests it has not taken in yet
        counted as waiting."""
        with self._lock:
            stats = dict(self._state.stats)
            stats["waiting"] += len(self._unacked)
        return stats  # type: ignore[return-value]

    def start(self) -> None:
        self._reader.start()

    def outputs_on(self, loop: asyncio.AbstractEventLoop) -> AbstractContextManager[None]:
        """Read the core's outputs on `loop` (engine/process/reader.py) while the context is
        open; entered and left on the loop's thread."""
        return self._reader.on_loop(loop)

    def _check_line(self, request: Request) -> None:
        """The core's line after its last step, with the requests sent since that it had not
        taken in."""
        state = self._state
        check_line(self.config, request.num_prompt_tokens, state.stats["running"],
                   state.stats["waiting"], [tokens for _, tokens in self._unacked],
                   state.line_tokens, self._retry_after)

    def _hand_over(self, request: Request) -> None:
        """An AddRequest to the core: the grammar as its spec (the core compiles its own)."""
        params = request.params
        grammar = (None if params.grammar is None
                   else GrammarMsg(params.grammar.spec.kind, params.grammar.spec.value))
        self._seq += 1
        if not self._send_encoded(self._encoder.encode(AddRequest(
                self._seq, request.request_id, request.prompt_token_ids,
                replace(params, grammar=None), grammar, time.monotonic() - request.arrival_time,
                request.priority, request.timeout, request.arrivals_behind))):
            raise EngineUnavailableError("The engine failed and takes no more requests: its "
                                         "engine core process has exited.")
        self._unacked.append((self._seq, request.num_prompt_tokens))

    def _retry_after(self, excess_requests: int = 0, excess_tokens: int = 0) -> int:
        rates = self._state.rates
        return retry_seconds(rates.requests_per_second, rates.tokens_per_second,
                             excess_requests, excess_tokens)

    def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id in self.texts and self._failure is None:
                self._send(Abort(request_id))

    def abort_all(self, error: str) -> None:
        """End every request in flight with `error` (code SHUTDOWN) at the core's next step."""
        with self._lock:
            self._send(AbortAll(error))

    def cached_block(self, block_id: int,
                     timeout: float = BLOCK_QUERY_TIMEOUT) -> CachedBlock | None:
        """A cached-free block's content for the dashboard (None: not cached-free), read by
        the core between two steps; TimeoutError if it does not answer in time."""
        if self.snapshots is None:
            return None
        if not self.is_alive:
            raise TimeoutError("the engine core process is gone")
        return self.snapshots.cached_block(block_id, timeout)

    def _send_now(self, message: ToCore) -> None:
        with self._lock:
            if self._failure is None:
                self._send(message)

    def _end_sample(self, sample_id: str) -> None:
        """A stop string ended this sample here: the core ends it too, freeing its blocks."""
        self._send_now(EndSample(sample_id))

    def _send(self, message: ToCore) -> None:  # with _lock held
        self._send_encoded(self._encoder.encode(message))

    def _send_encoded(self, message: bytes) -> bool:  # with _lock held
        """Send to the core; False if it has exited. zmq's send would wait for as long as no
        core is connected, on the caller's thread (the event loop): so it is tried without
        waiting, and while the core's line is full (it is alive but busy) tried again."""
        if self._requests.closed:  # (after shutdown, an abort has nothing left to end)
            return False
        while True:
            try:
                self._requests.send(message, zmq.NOBLOCK)
                return True
            except zmq.Again:
                if self._process.poll() is not None:
                    return False
                time.sleep(SEND_RETRY_SECONDS)

    def render_metrics(self) -> bytes:
        """The core's Prometheus text; if it does not answer within METRICS_TIMEOUT (it is
        dead), the last text it gave, under a comment saying so."""
        with self._metrics_lock:
            self._metrics_query += 1
            query = str(self._metrics_query).encode()
            if self.is_alive and self._send_query(query):
                deadline = time.monotonic() + METRICS_TIMEOUT
                while (left := deadline - time.monotonic()) > 0:
                    if not self._metrics.poll(int(left * 1000) + 1):
                        break
                    answered, text = self._metrics.recv_multipart()
                    if answered == query:  # not a late answer to an earlier query
                        self._last_metrics = text
                        return text
            return b"# the engine core process did not answer; its last metrics:\n" + (
                self._last_metrics)

    def _send_query(self, query: bytes) -> bool:
        """A metrics query to the core, without waiting (a core gone has no peer to take
        it, and zmq's send would wait for one)."""
        try:
            self._metrics.send(query, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def shutdown(self) -> None:
        """Tell the core to stop, wait for it (killing it after STOP_TIMEOUT), clean up; a
        second call returns at once."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
            self._closing = True
            if self._process.poll() is None:
                self._send(Shutdown())
        code = self._process.stop(STOP_TIMEOUT)
        log.info("the engine core process exited with status %d", code)
        self._reader.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._requests, self._outputs, self._metrics):
            sock.close()
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)
        os.close(self._dir_lock)

    # --- where the outputs are read (engine/process/reader.py) ------------------------------

    def _handle(self, message: FromCore) -> bool:
        """One message from the core; False once it was the last (Stopped)."""
        if isinstance(message, Report):
            self.texts.deliver(message.outputs)
            self._mirror(message.state)
        elif isinstance(message, Snapshot) and self.snapshots is not None:
            self.snapshots.received(message)
        elif isinstance(message, BlockAnswer) and self.snapshots is not None:
            self.snapshots.answered(message)
        elif isinstance(message, Failed):
            self._failure = message.error
        elif isinstance(message, Stopped):
            with self._lock:
                self._state = message.state
                self._unacked.clear()
            return False
        return True

    def _mirror(self, state: CoreState) -> None:
        with self._lock:
            self._state = state
            while self._unacked and self._unacked[0][0] <= state.taken:
                self._unacked.popleft()

    def _core_gone(self) -> bool:
        """Has the core exited unasked? Then fail what is in flight, refuse the rest and
        tell whoever asked."""
        code = self._process.poll()
        if code is None:
            return False
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        error = self._failure or (f"The engine failed and takes no more requests: the "
                                  f"engine core process {how}.")
        if not self._closing:  # an exit asked for is logged by shutdown()
            log.critical("the engine core process %s", how)
        with self._lock:
            self._failure = error
            self._unavailable = error
            self._unacked.clear()
        self.texts.fail_all(error)
        if not self._closing:
            self._failed()
        return True
