"""Each request tells the engine how many others the HTTP process is still checking and
tokenizing (engine/arrivals.py): one behind a request still tokenizing counts it, a job of
several prompts counts its own later prompts, and a refused request is not counted after."""

from __future__ import annotations

import threading

import httpx
import pytest

from api.openai.completions import CompletionServing
from tests.api.conftest import RunningServer

COMPLETIONS = "/v1/completions"


@pytest.fixture
def told(server: RunningServer, monkeypatch) -> list[tuple[list[int], int]]:
    """(prompt ids, arrivals_behind) of every request the engine is given, in order."""
    seen: list[tuple[list[int], int]] = []
    add = server.engine.add_request

    def recording(request) -> None:
        seen.append((list(request.prompt_token_ids), request.arrivals_behind))
        add(request)

    monkeypatch.setattr(server.engine, "add_request", recording)
    return seen


def complete(server: RunningServer, prompt, status: int = 200, **fields) -> None:
    r = httpx.post(server.url + COMPLETIONS, timeout=60, json={
        "prompt": prompt, "max_tokens": 1, "temperature": 0, **fields})
    assert r.status_code == status, r.text


def test_a_request_counts_one_still_tokenizing(server: RunningServer, told, monkeypatch,
                                               tokenizer) -> None:
    entered, release = threading.Event(), threading.Event()
    tokenize = CompletionServing.prompts

    def slow(self, body):  # runs on a worker thread
        if body.prompt == "Hold on":
            entered.set()
            release.wait(30)
        return tokenize(self, body)

    monkeypatch.setattr(CompletionServing, "prompts", slow)
    held = threading.Thread(target=complete, args=(server, "Hold on"))
    held.start()
    try:
        assert entered.wait(30)
        complete(server, "Go")
    finally:
        release.set()
        held.join(60)
    go, hold = tokenizer("Go").input_ids, tokenizer("Hold on").input_ids
    assert told == [(go, 1), (hold, 0)]


def test_a_job_of_three_prompts_announces_its_own_rest(server: RunningServer, told) -> None:
    complete(server, ["One", "Two", "Three"])
    assert [behind for _, behind in told] == [2, 1, 0]


def test_a_refused_request_is_not_counted_after(server: RunningServer, told) -> None:
    complete(server, "Hi", status=404, model="no-such-model")
    complete(server, "Hi", status=400, max_tokens=10**9)  # refused after tokenizing
    complete(server, "Hi")
    assert [behind for _, behind in told] == [0]
