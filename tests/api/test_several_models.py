"""Several models behind one address (api/model_router.py), as `python3 server.py --model A
--model NAME=B` serves them: each in an engine core process of its own, each request routed
by its `model`, one model's failure its own, a drain that stops them all."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import pytest

from api.model_router import labelled, merge_metrics
from benchmarks.live_server import LiveServer
from tests.families import save_family

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Hi"}]


def ask(url: str, model: str | None, tokens: int = 8) -> httpx.Response:
    body = {"messages": HI, "max_tokens": tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", timeout=120,
                      json=body if model is None else {**body, "model": model})


@pytest.fixture(scope="module")
def two(tmp_path_factory, model_dir):
    folder = save_family("qwen3", tmp_path_factory.mktemp("tiny") / "tiny-qwen3", model_dir)
    log = tmp_path_factory.mktemp("several") / "server.log"
    server = LiveServer([sys.executable, "server.py", "--model", str(folder),
                         "--model", "smol=SmolLM2-135M-Instruct", "--port", "{port}",
                         "--num-blocks", "64"], log, cwd=ROOT)
    with server:
        yield server


def core_pids(log: Path) -> dict[str, int]:
    """Each model's engine core process, from its startup line."""
    return {name: int(pid) for name, pid in re.findall(
        r"nano-vLLM: (\S+) on .*?engine core in process (\d+)", log.read_text())}


def test_every_model_is_listed_and_healthy(two):
    listing = httpx.get(f"{two.url}/v1/models").json()
    assert [card["id"] for card in listing["data"]] == ["tiny-qwen3", "smol"]
    assert (listing["first_id"], listing["last_id"]) == ("tiny-qwen3", "smol")
    assert httpx.get(f"{two.url}/v1/models/smol").json()["id"] == "smol"
    health = httpx.get(f"{two.url}/health").json()
    assert health == {"status": "ok", "models": {"tiny-qwen3": "ok", "smol": "ok"}}


def test_each_request_goes_to_its_model_and_answers_as_alone(two, server):
    """Concurrent requests to both; smol answers as the default model served alone does
    (the suite's in-process server), the first model takes requests without a model."""
    alone = ask(server.url, None).json()["choices"][0]["message"]["content"]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda m: ask(two.url, m).json(),
                                ["smol", "tiny-qwen3", None, "smol", "default", "tiny-qwen3"]))
    assert [a["model"] for a in answers] == ["smol", "tiny-qwen3", "tiny-qwen3", "smol",
                                             "tiny-qwen3", "tiny-qwen3"]
    texts = [a["choices"][0]["message"]["content"] for a in answers]
    assert texts[0] == texts[3] == alone
    assert texts[1] == texts[2] == texts[4] == texts[5]
    metrics = httpx.get(f"{two.url}/metrics").text
    assert re.search(r'request_success_total\{model="smol",finished_reason="length"\} [2-9]',
                     metrics)


def test_an_unknown_model_is_a_404_naming_the_models(two):
    r = ask(two.url, "gpt-5")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "'tiny-qwen3', 'smol'" in r.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError, match="smol"):
        anthropic.Anthropic(base_url=two.url, api_key="x").messages.create(
            model="claude", max_tokens=4, messages=HI)
    assert httpx.get(f"{two.url}/v1/models/gpt-5").status_code == 404


def test_metrics_are_labelled_by_model():
    texts = {"a": b"# HELP x_total X.\n# TYPE x_total counter\nx_total 1.0\n",
             "b": b'# HELP x_total X.\n# TYPE x_total counter\nx_total{k="v"} 2.0\n'}
    assert merge_metrics(texts).decode().splitlines() == [
        "# HELP x_total X.", "# TYPE x_total counter", 'x_total{model="a"} 1.0',
        'x_total{model="b",k="v"} 2.0']
    assert labelled("y{} 3", "m") == 'y{model="m"} 3'


def test_one_model_failing_leaves_the_others_serving(two):
    """Its engine core killed: its requests get 503, the other model serves on, and the
    server stays up (it exits only when asked). Runs last in this module: it kills one."""
    pids = core_pids(two.log)
    assert set(pids) == {"tiny-qwen3", "smol"}
    os.kill(pids["tiny-qwen3"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while ask(two.url, "tiny-qwen3").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert ask(two.url, "smol").status_code == 200
    health = httpx.get(f"{two.url}/health")
    assert health.status_code == 200 and health.json()["models"]["smol"] == "ok"
    assert health.json()["models"]["tiny-qwen3"] != "ok"
    assert two.proc.poll() is None
    assert two.stop() == 0  # SIGTERM drains what is left, then exits 0
    time.sleep(0.5)
    assert not Path(f"/proc/{pids['smol']}").exists()  # no engine process left behind
    print(json.dumps(health.json()))
