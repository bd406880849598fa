"""Who gets in and in what order, over real HTTP: priority (both endpoints), the prompt-token
cap, and a Retry-After measured from the drain rate."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from tests.api.conftest import RunningServer, serve
from tests.api.test_server import check_error, stats_when_idle
from tests.waiting import wait_for

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def one_seat_priority(model, tokenizer) -> Iterator[RunningServer]:
    """One seat, strict priority (no aging), a cap of 120 queued prompt tokens."""
    config = EngineConfig(num_blocks=64, max_num_seqs=1, scheduling_policy="priority",
                          priority_aging=0, max_num_queued_tokens=120, max_waiting=8)
    yield from serve(BatchEngine(config, model, tokenizer))


def occupy_seat(server: RunningServer, max_tokens: int) -> threading.Thread:
    """A long request holding the only seat; returns its thread (join it when done)."""
    def hold() -> None:
        r = httpx.post(server.url + COMPLETIONS, timeout=120, json={
            "prompt": "Hold", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200, r.text

    thread = threading.Thread(target=hold)
    thread.start()
    wait_for(lambda: server.engine.stats()["running"] == 1)
    return thread


def test_lower_priority_value_is_served_first_on_both_endpoints(one_seat_priority):
    """While one request holds the seat, five queue in the order worst priority first;
    they must be seated (and so finish, one seat) best priority first."""
    server = one_seat_priority
    finished: list[str] = []
    lock = threading.Lock()

    def send(name: str, path: str, priority: int) -> None:
        body = {"max_tokens": 2, "ignore_eos": True, "temperature": 0, "priority": priority}
        body |= ({"prompt": f"Say {name}"} if path == COMPLETIONS
                 else {"messages": [{"role": "user", "content": f"Say {name}"}]})
        r = httpx.post(server.url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        with lock:
            finished.append(name)

    holder = occupy_seat(server, max_tokens=40)
    queued = [("p9", COMPLETIONS, 9), ("p5-chat", CHAT, 5), ("p0", COMPLETIONS, 0),
              ("m3-chat", CHAT, -3), ("m7", COMPLETIONS, -7)]
    threads = []
    for i, (name, path, priority) in enumerate(queued):
        threads.append(threading.Thread(target=send, args=(name, path, priority)))
        threads[-1].start()
        wait_for(lambda i=i: server.engine.stats()["waiting"] == i + 1)  # in arrival order
    assert server.engine.stats()["running"] == 1, "the holder finished too early"
    for thread in [holder, *threads]:
        thread.join()
    print("finished in order:", finished)
    assert finished == ["m7", "m3-chat", "p0", "p5-chat", "p9"]


def test_priority_is_refused_under_fcfs(server):
    """The default policy cannot honour a priority: a 400 naming the field, not ignored."""
    for path, body in ((COMPLETIONS, {"prompt": "Hi"}),
                       (CHAT, {"messages": [{"role": "user", "content": "Hi"}]})):
        r = httpx.post(server.url + path, json={**body, "max_tokens": 1, "priority": 3})
        error = check_error(r, param="priority")
        print(path, error["message"])
    ok = httpx.post(server.url + COMPLETIONS, json={"prompt": "Hi", "max_tokens": 1,
                                                    "priority": 0}, timeout=60)
    assert ok.status_code == 200  # the default value is fine anywhere
    check_error(httpx.post(server.url + COMPLETIONS, json={
        "prompt": "Hi", "max_tokens": 1, "priority": 2**40}), param="priority")


def test_queued_prompt_tokens_are_capped_with_a_measured_retry_after(one_seat_priority,
                                                                     tokenizer):
    """Cap 120 queued prompt tokens: with 100 waiting, a 300-token prompt is refused (429,
    a Retry-After from the drain rate for the 280 tokens too many) while a 15-token one
    still fits. (The rate was measured while the previous test's line drained.)"""
    server = one_seat_priority
    prompt100 = " ".join(["cat"] * 100)
    prompt300, prompt15 = " ".join(["dog"] * 300), " ".join(["fox"] * 15)
    assert [len(tokenizer(p).input_ids) for p in (prompt100, prompt300, prompt15)] == [
        100, 300, 15]
    holder = occupy_seat(server, max_tokens=40)
    waiter = threading.Thread(target=lambda: httpx.post(
        server.url + COMPLETIONS, json={"prompt": prompt100, "max_tokens": 1}, timeout=120))
    waiter.start()
    wait_for(lambda: server.engine.stats()["waiting"] == 1)
    rate = server.engine.drain_rate
    before = rate.retry_after(excess_tokens=280)  # 100 + 300 - 120 tokens too many
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": prompt300, "max_tokens": 1})
    after = rate.retry_after(excess_tokens=280)
    error = check_error(r, 429, "rate_limit_error")
    retry_after = int(r.headers["Retry-After"])
    print(f"{error['message']}; Retry-After {retry_after} s; drain rate "
          f"{rate.requests_per_second} req/s, {rate.tokens_per_second} tokens/s")
    assert error["code"] == "rate_limit_exceeded" and "queued" in error["message"]
    assert f"retry after {retry_after} s" in error["message"]
    # The measured token rate says how long 280 tokens take to drain (it moves a little
    # with every step, so the figure is one of those just before and after).
    assert retry_after in (before, after), (before, retry_after, after)
    assert rate.tokens_per_second is not None  # measured, not the default
    fits = threading.Thread(target=lambda: httpx.post(
        server.url + COMPLETIONS, json={"prompt": prompt15, "max_tokens": 1}, timeout=120))
    fits.start()
    wait_for(lambda: server.engine.stats()["waiting"] == 2)
    for thread in (holder, waiter, fits):
        thread.join()
    assert stats_when_idle(server)["blocks_used"] == 0
