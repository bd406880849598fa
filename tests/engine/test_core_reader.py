"""engine/process/reader.py over real ZMQ sockets: the core's messages are read on a thread of
their own, or on an event loop while one takes over (each message once, in order, on the
loop's thread), and on a thread again after it; the last message, or a dead core, ends it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from engine.process.messages import Failed, FromCore
from engine.process.reader import OutputReader
from tests.waiting import wait_for

LAST = "last"


class Recorder:
    """handle(): each message's text and the thread it was read on; False after LAST."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.gone = False  # what core_gone() answers

    def handle(self, message: FromCore) -> bool:
        assert isinstance(message, Failed)
        self.seen.append((message.error, threading.get_ident()))
        return message.error != LAST

    def core_gone(self) -> bool:
        return self.gone

    def texts(self) -> list[str]:
        return [text for text, _ in self.seen]


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind("inproc://outputs")
    push = context.socket(zmq.PUSH)
    push.connect("inproc://outputs")
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)
    context.term()


def send(push: zmq.Socket, *texts: str) -> None:
    for text in texts:
        push.send(msgspec.msgpack.encode(Failed(text)))


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def reader_for(pull: zmq.Socket, recorder: Recorder) -> OutputReader:
    return OutputReader(pull, msgspec.msgpack.Decoder(FromCore), recorder.handle,
                        recorder.core_gone)


def test_on_its_thread_until_the_last_message(sockets):
    push, pull = sockets
    recorder = Recorder()
    reader = reader_for(pull, recorder)
    reader.start()
    send(push, "a", "b", LAST, "after the last")
    wait_for(lambda: len(recorder.seen) == 3)
    reader.join(timeout=5)
    assert recorder.texts() == ["a", "b", LAST]
    assert threading.get_ident() not in {thread for _, thread in recorder.seen}


def test_the_loop_takes_over_and_hands_back(sockets):
    push, pull = sockets
    recorder = Recorder()
    reader = reader_for(pull, recorder)
    reader.start()
    send(push, "on the thread")
    wait_for(lambda: len(recorder.seen) == 1)
    loop_thread = threading.get_ident()

    async def serve() -> None:
        with reader.on_loop(asyncio.get_running_loop()):
            send(push, "on the loop 1", "on the loop 2")
            await until(lambda: len(recorder.seen) == 3)
            send(push, "on the loop 3")
            await until(lambda: len(recorder.seen) == 4)

    asyncio.run(serve())
    send(push, "on the thread again", LAST)
    wait_for(lambda: len(recorder.seen) == 6)
    reader.join(timeout=5)
    assert recorder.texts() == ["on the thread", "on the loop 1", "on the loop 2",
                                "on the loop 3", "on the thread again", LAST]
    threads = [thread for _, thread in recorder.seen]
    assert threads[1:4] == [loop_thread] * 3
    assert loop_thread not in (threads[0], threads[4], threads[5])


def test_what_came_before_the_loop_is_read_on_it(sockets):
    # The descriptor signals only what arrives after it is watched: messages already queued
    # when the loop takes over must not wait for the next one.
    push, pull = sockets
    recorder = Recorder()
    reader = reader_for(pull, recorder)
    send(push, "queued 1", "queued 2")
    time.sleep(0.05)

    async def serve() -> None:
        with reader.on_loop(asyncio.get_running_loop()):
            await until(lambda: len(recorder.seen) == 2, timeout=1.0)
            send(push, LAST)
            await until(lambda: len(recorder.seen) == 3)

    asyncio.run(serve())
    assert recorder.texts() == ["queued 1", "queued 2", LAST]
    assert {thread for _, thread in recorder.seen} == {threading.get_ident()}


def test_a_dead_core_is_noticed_on_the_loop_and_nothing_reads_after(sockets):
    push, pull = sockets
    recorder = Recorder()
    reader = reader_for(pull, recorder)
    reader.start()
    asked: list[float] = []

    def core_gone() -> bool:
        asked.append(time.monotonic())
        return len(asked) >= 2  # dead at the second look

    reader._core_gone = core_gone

    async def serve() -> None:
        with reader.on_loop(asyncio.get_running_loop()):
            await until(lambda: len(asked) >= 2)
            await asyncio.sleep(0.3)  # no more looks once it is gone

    asyncio.run(serve())
    assert len(asked) == 2
    send(push, "after its death")
    time.sleep(0.2)
    assert recorder.seen == []  # no thread was started again to read
