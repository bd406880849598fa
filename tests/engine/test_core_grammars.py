"""The engine core process holds a request whose grammar it has not compiled yet, and queues
it once the worker thread is done, so a new schema never stalls the step loop. Driven here
without sockets or a model: a stand-in engine records what is queued and aborted, and a
stand-in compiler hands out futures the test completes."""

from __future__ import annotations

from concurrent.futures import Future

from engine.process.loop import CoreProcess
from engine.process.messages import Abort, AbortAll, AddRequest, GrammarMsg
from engine.request import SamplingParams
from engine.structured.grammar import GrammarKind


class Engine:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, object]] = []

    def add(self, request) -> None:
        self.log.append(("add", request.request_id, request.params.grammar))

    def abort(self, request_id: str) -> None:
        self.log.append(("abort", request_id, None))

    def abort_all(self, error: str) -> None:
        self.log.append(("abort_all", error, None))


class Grammar:
    """A compiled grammar's stand-in: a Request asks it for a matcher."""

    def __init__(self, name: str) -> None:
        self.name = name

    def matcher(self) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grammar) and other.name == self.name

    __hash__ = None  # type: ignore[assignment]


class Compiler:
    """Schemas named "known" are cached; any other compiles until the test says so."""

    def __init__(self) -> None:
        self.futures: dict[str, Future] = {}

    def cached(self, spec):
        return Grammar(spec.value) if spec.value == "known" else None

    def compile_later(self, spec) -> Future:
        return self.futures.setdefault(spec.value, Future())


def core() -> CoreProcess:
    process = CoreProcess.__new__(CoreProcess)  # no sockets: only the intake is used
    process.engine, process._grammars = Engine(), Compiler()
    process._compiling, process._pending, process._received = {}, [], 0
    return process


def add(process: CoreProcess, request_id: str, schema: str | None) -> None:
    grammar = None if schema is None else GrammarMsg(GrammarKind.REGEX, schema)
    process._handle(AddRequest(1, request_id, [1, 2, 3], SamplingParams(max_tokens=4),
                               grammar, age=0.0))


def test_a_new_grammar_is_held_until_compiled_and_others_go_on() -> None:
    process = core()
    add(process, "slow", "new")
    add(process, "plain", None)
    add(process, "cached", "known")
    process._queue_compiled()
    assert [entry[1] for entry in process.engine.log] == ["plain", "cached"]
    process._grammars.futures["new"].set_result(Grammar("new"))
    process._queue_compiled()
    assert process.engine.log[-1] == ("add", "slow", Grammar("new"))
    assert not process._compiling


def test_an_abort_while_compiling_ends_it_as_any_abort() -> None:
    process = core()
    add(process, "slow", "new")
    process._handle(Abort("slow"))
    assert process.engine.log == [("add", "slow", None), ("abort", "slow", None)]
    assert not process._compiling
    process._grammars.futures["new"].set_result(Grammar("new"))  # finishing later: ignored
    process._queue_compiled()
    assert len(process.engine.log) == 2


def test_abort_all_takes_the_held_requests_too() -> None:
    process = core()
    add(process, "a", "new")
    add(process, "b", "other")
    process._handle(AbortAll("shutting down"))
    assert process.engine.log == [("add", "a", None), ("add", "b", None),
                                  ("abort_all", "shutting down", None)]


def test_a_grammar_that_fails_here_aborts_its_request() -> None:
    process = core()
    add(process, "bad", "new")
    process._grammars.futures["new"].set_exception(ValueError("no"))
    process._queue_compiled()
    assert process.engine.log == [("add", "bad", None), ("abort", "bad", None)]
