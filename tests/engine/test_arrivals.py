"""engine/arrivals.py: after an idle spell, the first step waits for the rest of a burst its
first request announces, and for nothing when none is announced. `gather` alone; the engine
core process's intake over a real socket with a stand-in engine; the in-process engine."""

from __future__ import annotations

import threading
import time

import msgspec
import zmq

from engine.arrivals import gather
from engine.config import EngineConfig
from engine.process.loop import CoreProcess, no_custom_types
from engine.process.messages import AddRequest, ToCore, open_socket
from engine.request import Request, RequestOutput, SamplingParams
from tests.engine.test_engine import make_engine, record_step_tokens
from tests.waiting import wait_for

LIMIT_S = EngineConfig().burst_wait_ms / 1000  # the default, 50 ms
SPACING_S = 0.008  # between a burst's requests: four well inside the limit


def test_gather_takes_in_until_nothing_is_announced() -> None:
    announced = [2]
    waits: list[float] = []

    def take(seconds: float) -> None:
        waits.append(seconds)
        announced[0] -= 1

    gather(lambda: announced[0], take, LIMIT_S)
    assert len(waits) == 2 and announced[0] == 0


def test_gather_waits_for_nothing_unannounced_and_gives_up_at_its_limit() -> None:
    def take(seconds: float) -> None:
        raise AssertionError("waited with nothing announced")

    gather(lambda: 0, take, LIMIT_S)
    start = time.monotonic()
    gather(lambda: 1, time.sleep, 0.03)  # announced, never comes
    assert 0.03 <= time.monotonic() - start < 0.5
    gather(lambda: 1, take, 0)  # --burst-wait-ms 0: never waits


class Engine:
    """The core's engine, as its intake sees it: requests queued, and its config."""

    def __init__(self) -> None:
        self.queued: list[str] = []
        self.config = EngineConfig()

    def has_work(self) -> bool:
        return bool(self.queued)

    def add(self, request: Request) -> None:
        self.queued.append(request.request_id)


def send_burst(address: str, behind: list[int], spacing_s: float) -> threading.Thread:
    """AddRequests with these `behind` counts, `spacing_s` apart, from a thread."""
    def run() -> None:
        context = zmq.Context.instance()
        push = open_socket(context, zmq.PUSH, address, bind=False, linger_ms=1000)
        encoder = msgspec.msgpack.Encoder()
        for i, count in enumerate(behind):
            time.sleep(spacing_s if i else 0)
            push.send(encoder.encode(AddRequest(i + 1, f"r{i}", [1, 2, 3],
                                                SamplingParams(max_tokens=1), None, 0.0,
                                                behind=count)))
        push.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def intake_of(behind: list[int], spacing_s: float = SPACING_S) -> list[str]:
    """What an idle core's intake takes in, in one call, of a burst sent with `behind`."""
    address = f"inproc://arrivals-{id(behind)}"
    context = zmq.Context.instance()
    core = CoreProcess.__new__(CoreProcess)  # no engine, no outputs: the intake only
    core.engine, core.requests = Engine(), open_socket(context, zmq.PULL, address, bind=True,
                                                        linger_ms=0)
    core._decoder = msgspec.msgpack.Decoder(ToCore, dec_hook=no_custom_types)
    core._compiling, core._pending, core._received, core._behind = {}, [], 0, 0
    sender = send_burst(address, behind, spacing_s)
    try:
        core._take_messages()
        return list(core.engine.queued)
    finally:
        sender.join()
        core.requests.close()


def test_an_idle_core_takes_in_the_announced_burst_before_its_first_step() -> None:
    assert intake_of([3, 2, 1, 0]) == ["r0", "r1", "r2", "r3"]


def test_an_idle_core_starts_at_once_for_a_request_that_announces_none() -> None:
    assert intake_of([0, 0], spacing_s=0.3) == ["r0"]


def test_the_in_process_engine_seats_an_announced_burst_in_one_step(model, tokenizer) -> None:
    engine = make_engine(model, tokenizer)
    steps = record_step_tokens(engine)
    done: list[RequestOutput] = []
    prompts = [tokenizer(f"Question {i}: why is the sky blue?").input_ids for i in range(4)]
    engine.start()
    try:
        time.sleep(0.05)  # idle
        for i, ids in enumerate(prompts):
            time.sleep(SPACING_S if i else 0)
            engine.add_request(Request(str(i), ids, SamplingParams(max_tokens=1, temperature=0),
                                       done.append, arrivals_behind=len(prompts) - 1 - i))
        wait_for(lambda: sum(o.finished for o in done) == len(prompts), timeout=60)
    finally:
        engine.shutdown()
    assert steps[0] == sum(len(ids) for ids in prompts)  # all four prompts in the first step
