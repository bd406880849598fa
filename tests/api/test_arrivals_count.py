"""Each request tells the engine how many others the HTTP process has taken in and not yet
handed over (engine/arrivals.py): a job of several prompts counts its own later prompts, and
a refused request leaves the count as it found it."""

from __future__ import annotations

import httpx
import pytest

from api.serving import ARRIVALS
from tests.api.conftest import RunningServer

COMPLETIONS = "/v1/completions"


@pytest.fixture
def told(server: RunningServer, monkeypatch) -> list[int]:
    """arrivals_behind of every request the engine is given, in order."""
    seen: list[int] = []
    add = server.engine.add_request

    def recording(request) -> None:
        seen.append(request.arrivals_behind)
        add(request)

    monkeypatch.setattr(server.engine, "add_request", recording)
    return seen


def test_a_job_of_three_prompts_announces_its_own_rest(server: RunningServer, told) -> None:
    r = httpx.post(server.url + COMPLETIONS, timeout=60, json={
        "prompt": ["One", "Two", "Three"], "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    assert told == [2, 1, 0]
    assert ARRIVALS.count == 0


def test_a_refused_request_leaves_the_count_alone(server: RunningServer, told) -> None:
    r = httpx.post(server.url + COMPLETIONS, timeout=60, json={
        "prompt": "Hi", "max_tokens": 1, "model": "no-such-model"})
    assert r.status_code == 404, r.text
    assert told == [] and ARRIVALS.count == 0
