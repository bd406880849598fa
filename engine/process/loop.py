"""The engine core in a process of its own (`server.py --engine-process`).

`python3 -m engine.process.loop ADDRESSES CONFIG` is started by engine/process/launch.py. It
pins itself to its CPUs, loads the model into an engine loop (engine/engine_loop.py), picks
how many tokens a step needs to use every thread (engine/thread_choice.py: measured once per
machine, then cached) and runs it on its main thread in a busy loop, with no HTTP server
beside it to share the GIL:

1. take what the API process sent (engine/process/messages.py): new requests (admitted there
   already), aborts, the samples whose text reached a stop string there (the API process
   detokenizes: this one sends token ids), the end of every request at a drain's timeout,
   shutdown; for the dashboard, that someone watches, and queries for a cached-free block's
   content (answered at once: between steps, this thread may read the pool); after an idle
   spell, also the rest of a burst its first request announces (engine/arrivals.py);
2. one step of the engine;
3. send the outputs that step produced (token ids, no text), and the core's counts, as one
   Report; and the
   dashboard's snapshot, when the step (or, idle, the last one) took a new one.

A thread answers the API's metrics queries meanwhile. The process exits when told to
(status 0), when the engine dies (after reporting the failure; status 70), or when its
parent is gone (status 0; a thread watches, while it loads too): it never outlives the
server. It ignores SIGINT and SIGTERM, which a terminal or a supervisor may send the whole
process group: the server drains first, then tells the core to stop.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future

import msgspec
import zmq

from engine.arrivals import gather
from engine.core import EngineCore, PagedEngineCore
from engine.engine_loop import EngineLoop
from engine.heap import freeze_startup_heap
from engine.load import load_engine_loop
from engine.process.messages import (
    Abort,
    AbortAll,
    AddRequest,
    BlockAnswer,
    BlockQuery,
    CoreState,
    EndSample,
    Failed,
    Rates,
    Ready,
    Report,
    Shutdown,
    Snapshot,
    Stopped,
    ToCore,
    Watch,
    decode_config,
    open_socket,
)
from engine.request import Request, RequestOutput
from engine.snapshot import EngineSnapshot
from engine.structured.compiler import GrammarCompiler
from engine.structured.grammar import CompiledGrammar
from engine.thread_choice import choose_threads
from model.memory import describe_start_error
from model.prepare import ModelPreparationError
from model.weights.quantized import QuantizedKernelUnavailable

log = logging.getLogger("nano_vllm.core")

FAILURE_EXIT_CODE = 70  # as api/lifecycle.py's ENGINE_FAILURE_EXIT_CODE
COMPILE_POLL_MS = 5  # with only requests whose grammar compiles: how soon to look again
IDLE_POLL_MS = 200  # with nothing to do: how long to wait for a message
PARENT_POLL_S = 0.2  # how often the watch thread looks for the server process
PAGED_CORE = "engine.core:PagedEngineCore"  # --core's default: nano-vLLM's own


def no_custom_types(kind: type, value: object) -> object:
    raise TypeError(f"{kind} cannot cross between processes")


class CoreProcess:
    def __init__(self, engine: EngineLoop, addresses: dict[str, str]) -> None:
        self.engine = engine
        self.context = zmq.Context()
        self.requests = self._socket(zmq.PULL, addresses["requests"])
        self.outputs = self._socket(zmq.PUSH, addresses["outputs"])
        self._metrics_address = addresses["metrics"]
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(ToCore, dec_hook=no_custom_types)
        self._grammars = GrammarCompiler(engine.tokenizer)
        # Requests whose grammar this process has not compiled yet: held here, compiled on a
        # worker thread (llguidance builds with the GIL released), queued once it is ready,
        # so that a new schema does not stall every stream's step while it compiles.
        self._compiling: dict[str, tuple[Future[CompiledGrammar], AddRequest]] = {}
        self._pending: list[tuple[str, RequestOutput]] = []  # filled by the step's callbacks
        self._received = 0  # the last AddRequest.seq received
        self._behind = 0  # the last AddRequest.behind received
        self._stopping = False
        self._sent_snapshot: EngineSnapshot | None = None

    def _socket(self, kind: int, address: str) -> zmq.Socket:
        return open_socket(self.context, kind, address, bind=False, linger_ms=2000)

    def state(self) -> CoreState:
        rate = self.engine.drain_rate
        return CoreState(self.engine.stats(), self.engine.core.num_waiting_tokens(),
                         self._received, Rates(rate.requests_per_second, rate.tokens_per_second))

    def send(self, message: Ready | Report | Failed | Stopped | Snapshot | BlockAnswer) -> None:
        self.outputs.send(self._encoder.encode(message))

    def run(self) -> int:
        """The busy loop; the process's exit status."""
        threading.Thread(target=self._answer_metrics, name="metrics", daemon=True).start()
        engine = self.engine
        self.send(Ready(os.getpid(), engine.max_tokens_per_request, engine.model_type,
                        engine.max_position_embeddings, engine.describe(), self.state(),
                        engine.snapshots is not None, engine.embedding_info))
        try:
            while not self._stopping:
                self._take_messages()
                self._queue_compiled()
                if engine.has_work():
                    engine.step()
                    self._report()
                else:
                    engine.snapshot_when_idle()
                self._send_snapshot()
        except BaseException as exc:  # what the step's own error handling could not catch
            log.critical("the engine core died", exc_info=exc)
            error = f"The engine failed and takes no more requests: {exc!r}"
            engine.die(error)  # error outputs for every request in flight
            self._report()
            self.send(Failed(error))
            return FAILURE_EXIT_CODE
        self.send(Stopped(self.state()))
        return 0

    def _report(self) -> None:
        outputs, self._pending = self._pending, []
        self.send(Report(outputs, self.state()))

    def _send_snapshot(self) -> None:
        """The dashboard's latest snapshot, if the core took one since the last sent (only
        while watched: otherwise none is taken, and this costs one comparison a step)."""
        board = self.engine.snapshots
        if board is not None and board.latest is not self._sent_snapshot:
            self._sent_snapshot = board.latest
            self.send(Snapshot(msgspec.json.encode(board.latest)))

    def _take_messages(self) -> None:
        """What the API process sent: waiting for it while there is nothing to do, and after
        an idle spell, the rest of the burst the first request announces (engine/arrivals.py)."""
        idle = not self.engine.has_work()
        self._take(0 if not idle else COMPILE_POLL_MS if self._compiling else IDLE_POLL_MS)
        if idle and (self.engine.has_work() or self._compiling):
            gather(lambda: self._behind, lambda seconds: self._take(math.ceil(seconds * 1000)),
                   self.engine.config.burst_wait_ms / 1000)
        self._behind = 0  # said once: a later idle spell waits only for what it is told

    def _take(self, timeout_ms: int) -> None:
        """Handle every message waiting, after waiting up to `timeout_ms` for the first."""
        if not self.requests.poll(timeout_ms):
            return
        while True:
            try:
                raw = self.requests.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(self._decoder.decode(raw))

    def _handle(self, message: ToCore) -> None:
        engine = self.engine
        if isinstance(message, AddRequest):
            self._received = message.seq
            self._behind = message.behind
            self._add(message)
        elif isinstance(message, Abort):
            self._queue_compiled(message.request_id)  # so that it ends as any other does
            engine.abort(message.request_id)
        elif isinstance(message, EndSample):
            engine.end_sample(message.request_id)
        elif isinstance(message, AbortAll):
            self._queue_compiled(*self._compiling)
            engine.abort_all(message.error)
        elif isinstance(message, Shutdown):
            self._stopping = True
        elif isinstance(message, Watch):
            if engine.snapshots is not None:
                engine.snapshots.want()
        elif isinstance(message, BlockQuery):
            block = engine.read_cached_block(message.block_id)
            self.send(BlockAnswer(message.query, msgspec.json.encode(block)))

    def _add(self, message: AddRequest) -> None:
        """Queue the request now, or once its grammar has compiled here (the API process
        compiled it already, so it is valid, but this process has its own cache)."""
        if message.grammar is None:
            self.engine.add(self._request(message, None))
            return
        spec = message.grammar.spec()
        grammar = self._grammars.cached(spec)
        if grammar is not None:
            self.engine.add(self._request(message, grammar))
        else:
            self._compiling[message.request_id] = (self._grammars.compile_later(spec), message)

    def _queue_compiled(self, *cut_short: str) -> None:
        """Queue every held request whose grammar is ready, and those in `cut_short` (about
        to be aborted: they go in without one, to end the way every aborted request ends)."""
        for request_id, (future, message) in list(self._compiling.items()):
            if request_id in cut_short:
                grammar = None
            elif not future.done():
                continue
            elif future.exception() is not None:  # though the API's compile of it succeeded
                log.error("the grammar of %s did not compile here: %s", request_id,
                          future.exception())
                del self._compiling[request_id]
                self.engine.add(self._request(message, None))
                self.engine.abort(request_id)
                continue
            else:
                grammar = future.result()
            del self._compiling[request_id]
            self.engine.add(self._request(message, grammar))

    def _request(self, message: AddRequest, grammar: CompiledGrammar | None) -> Request:
        params = message.params
        params.grammar = grammar
        request_id = message.request_id

        def deliver(output: RequestOutput) -> None:  # samples share their parent's callback
            self._pending.append((request_id, output))

        request = Request(request_id, message.prompt_token_ids, params, deliver,
                          arrival_time=time.monotonic() - message.age,
                          priority=message.priority)
        request.timeout = message.timeout
        return request

    def _answer_metrics(self) -> None:
        """Each query (an id) gets back the id and /metrics' text, also during a step."""
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self._metrics_address)
        while True:
            identity, query = sock.recv_multipart()
            sock.send_multipart([identity, query, self.engine.metrics.render()])


def pin_to(cpus: set[int] | None) -> None:
    """Run on `cpus` (default: every CPU this process may use), with the thread count
    engine/core.py derives from them (or --threads)."""
    os.sched_setaffinity(0, cpus or os.sched_getaffinity(0))


def core_class_at(path: str) -> type[EngineCore]:
    """The engine core class at "module:Class" (--core; e.g. the baseline's)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def exit_when_orphaned(parent: int) -> None:
    """Exit (status 0) as soon as the server that started this process is gone, whatever
    the core is doing: loading (the model, a first start's kernel compile and thread
    measurement, a minute or more; its kernel build's lock goes with it,
    model/kernels/build.py build_lock), stepping or idle."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    log.warning("the server process is gone: stopping")
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="nano-vLLM's engine core process")
    parser.add_argument("--requests", required=True)
    parser.add_argument("--outputs", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--config", required=True, help="EngineConfig as JSON")
    parser.add_argument("--cpus", default=None, help="CPU ids to pin to, e.g. 0,1")
    parser.add_argument("--core", default=PAGED_CORE,
                        help="the engine core class, as module:Class")
    parser.add_argument("--parent", type=int, default=None,
                        help="the server's process id (default: this process's parent)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server drains, then says stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # From the server, which may have died while this process imported its modules.
    parent = os.getppid() if args.parent is None else args.parent
    threading.Thread(target=exit_when_orphaned, args=(parent,), daemon=True,
                     name="parent-watch").start()
    pin_to({int(c) for c in args.cpus.split(",")} if args.cpus else None)
    try:
        config = decode_config(args.config)
        engine = load_engine_loop(config, core_class_at(args.core))
    except (ModelPreparationError, ValueError, QuantizedKernelUnavailable, MemoryError) as exc:
        print(f"error: {describe_start_error(exc)}", file=sys.stderr)
        return 1
    if isinstance(engine.core, PagedEngineCore) and engine.core.runner.threads.watch:
        # The API process's CPU time is serving, not a neighbour taking our cores.
        engine.core.runner.threads.watch.load.add_own(parent)
    if config.measure_threads != "no":
        choose_threads(engine.core, again=config.measure_threads == "again", own_pids=[parent])
    addresses = {"requests": args.requests, "outputs": args.outputs, "metrics": args.metrics}
    core = CoreProcess(engine, addresses)
    freeze_startup_heap()  # the model and its imports: no collection between steps walks them
    code = core.run()
    core.outputs.close()  # lingers until what was sent is delivered
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not waiting on the metrics thread, blocked in a receive
