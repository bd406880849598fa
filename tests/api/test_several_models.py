"""Several models behind one address (api/model_router.py), as `python3 server.py --model A
--model NAME=B` serves them: each in an engine core process of its own, each request routed
by its `model`, one model's failure its own (and the model reloaded after it), a drain that
stops them all; loaded on demand, one at a time under --max-loaded-models 1, unloaded when
idle or by an operator (api/model_pool.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import pytest

from api.model_router import labelled, merge_metrics
from benchmarks.live_server import LiveServer, sse_events
from tests.families import save_embedding_model, save_family

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Hi"}]


KEY = "operator-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def ask(url: str, model: str | None, tokens: int = 8, key: str | None = None) -> httpx.Response:
    body = {"messages": HI, "max_tokens": tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {key}"} if key else None,
                      json=body if model is None else {**body, "model": model})


@pytest.fixture(scope="module")
def two(tmp_path_factory, model_dir):
    """A chat model, a second generating model and an embedding model side by side."""
    folder = save_family("qwen3", tmp_path_factory.mktemp("tiny") / "tiny-qwen3", model_dir)
    encoder = save_embedding_model(tmp_path_factory.mktemp("emb") / "emb", model_dir)
    log = tmp_path_factory.mktemp("several") / "server.log"
    server = LiveServer([sys.executable, "server.py", "--model", str(folder),
                         "--model", "smol=SmolLM2-135M-Instruct", "--model", f"emb={encoder}",
                         "--port", "{port}", "--num-blocks", "64"], log, cwd=ROOT)
    with server:
        yield server


def core_pids(log: Path) -> dict[str, int]:
    """Each model's engine core process, from its startup line."""
    return {name: int(pid) for name, pid in re.findall(
        r"nano-vLLM: (\S+) on .*?engine core in process (\d+)", log.read_text())}


def test_every_model_is_listed_and_healthy(two):
    listing = httpx.get(f"{two.url}/v1/models").json()
    assert [card["id"] for card in listing["data"]] == ["tiny-qwen3", "smol", "emb"]
    assert (listing["first_id"], listing["last_id"]) == ("tiny-qwen3", "emb")
    assert httpx.get(f"{two.url}/v1/models/smol").json()["id"] == "smol"
    assert {card["state"] for card in listing["data"]} == {"loaded"}
    health = httpx.get(f"{two.url}/health").json()
    assert health == {"status": "ok",
                      "models": {"tiny-qwen3": "loaded", "smol": "loaded", "emb": "loaded"}}


def test_the_embedding_model_serves_beside_the_chat_models(two):
    def embed(model: str) -> httpx.Response:
        return httpx.post(f"{two.url}/v1/embeddings", timeout=120,
                          json={"model": model, "input": ["Hi", "Hello there"]})

    with ThreadPoolExecutor(3) as pool:
        vectors, chat, _ = pool.map(lambda f: f(), [lambda: embed("emb"),
                                                    lambda: ask(two.url, "smol"),
                                                    lambda: embed("emb")])
    assert vectors.status_code == 200 and chat.status_code == 200
    assert [len(d["embedding"]) for d in vectors.json()["data"]] == [48, 48]
    assert vectors.json()["model"] == "emb"
    assert ask(two.url, "emb").json()["error"]["code"] == "model_not_generative"
    assert embed("smol").json()["error"]["code"] == "model_not_embedding"
    metrics = httpx.get(f"{two.url}/metrics").text
    assert re.search(r'nano_vllm:embedding_inputs_total\{model="emb"\} [4-9]', metrics)


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
    assert "'tiny-qwen3', 'smol', 'emb'" in r.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError, match="smol"):
        anthropic.Anthropic(base_url=two.url, api_key="x").messages.create(
            model="claude", max_tokens=4, messages=HI)
    assert httpx.get(f"{two.url}/v1/models/gpt-5").status_code == 404


def frames_of(url: str, model: str, count: int) -> list[dict]:
    """The first `count` snapshots /dashboard/events streams for `model` (the first may be
    from before the stream opened: snapshots are taken only while someone watches)."""
    with httpx.stream("GET", f"{url}/dashboard/events?model={model}", timeout=60) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(response.iter_lines())
        return [next(events)["frame"] for _ in range(count)]


def test_the_dashboard_shows_each_model(two):
    """The page lists every model; each generating model's stream is its own engine's (smol
    is busy with a long prompt while tiny-qwen3 idles); the encoder has no pool to show."""
    listing = httpx.get(f"{two.url}/dashboard/models?model=smol").json()
    assert listing["current"] == "smol"
    assert [(c["id"], c["state"], c["kv_cache"]) for c in listing["data"]] == [
        ("tiny-qwen3", "loaded", True), ("smol", "loaded", True), ("emb", "loaded", False)]
    assert httpx.get(f"{two.url}/dashboard/models").json()["current"] == "tiny-qwen3"
    with streaming(two.url, "smol") as stream:
        lines = stream.iter_lines()  # held: a dropped iterator closes the stream
        assert next(lines).startswith("data:")
        busy, idle = frames_of(two.url, "smol", 5), frames_of(two.url, "tiny-qwen3", 3)
    assert [r["status"] for r in busy[-1]["requests"]] == ["running"]
    assert not any(frame["requests"] for frame in idle)
    refused = httpx.get(f"{two.url}/dashboard/events?model=emb")
    assert refused.status_code == 404 and "no paged KV cache" in refused.json()["error"]["message"]
    unknown = httpx.get(f"{two.url}/dashboard/events?model=gpt-5")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    page = httpx.get(f"{two.url}/dashboard?model=emb")
    assert page.status_code == 200 and 'id="model"' in page.text


def test_the_page_picks_a_model(two):
    """In a real browser: the picker lists the three models, the page streams smol's
    snapshots, and says the encoder has nothing to draw."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None and os.environ.get("CI") != "true":
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{two.url}/dashboard?model=smol")
            page.locator("#status", has_text="live").wait_for(timeout=30_000)
            assert page.locator("#model-name").inner_text() == "smol"
            assert page.locator("#model option").all_inner_texts() == ["tiny-qwen3", "smol",
                                                                       "emb"]
            assert page.locator("#model").is_visible()
            page.select_option("#model", "emb")  # the page reloads with ?model=emb
            page.locator("#status", has_text="no paged KV cache").wait_for(timeout=30_000)
            assert page.url.endswith("?model=emb") and not errors, errors
        finally:
            browser.close()


def test_metrics_are_labelled_by_model():
    texts = {"a": b"# HELP x_total X.\n# TYPE x_total counter\nx_total 1.0\n",
             "b": b'# HELP x_total X.\n# TYPE x_total counter\nx_total{k="v"} 2.0\n'}
    assert merge_metrics(texts).decode().splitlines() == [
        "# HELP x_total X.", "# TYPE x_total counter", 'x_total{model="a"} 1.0',
        'x_total{model="b",k="v"} 2.0']
    assert labelled("y{} 3", "m") == 'y{model="m"} 3'


def test_one_model_failing_leaves_the_others_serving_and_reloads(two):
    """Its engine core killed: its requests get 503 with Retry-After, the other model serves
    on, and the server stays up (it exits only when asked); after the backoff the next
    request loads it again in a new process. Runs last for `two`: it stops the server."""
    pids = core_pids(two.log)
    assert set(pids) == {"tiny-qwen3", "smol", "emb"}
    before = ask(two.url, "tiny-qwen3").json()["choices"][0]["message"]["content"]
    os.kill(pids["tiny-qwen3"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    # Until the server has noticed, the dead engine's own app refuses (503, no Retry-After);
    # then the model is failed, and its requests get 503 with the restart's Retry-After.
    while "Retry-After" not in (refused := ask(two.url, "tiny-qwen3")).headers:
        assert refused.status_code == 503 and time.monotonic() < deadline, refused.text
        time.sleep(0.2)
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert ask(two.url, "smol").status_code == 200
    health = httpx.get(f"{two.url}/health")
    print(json.dumps(health.json()))
    assert health.status_code == 200 and health.json()["models"]["smol"] == "loaded"
    assert health.json()["models"]["tiny-qwen3"] == "failed"
    assert "SIGKILL" in health.json()["errors"]["tiny-qwen3"]
    assert two.proc.poll() is None
    time.sleep(int(refused.headers["Retry-After"]))  # the restart policy: reloaded on demand
    again = ask(two.url, "tiny-qwen3")
    assert again.status_code == 200
    assert again.json()["choices"][0]["message"]["content"] == before
    restarted = core_pids(two.log)["tiny-qwen3"]
    assert restarted != pids["tiny-qwen3"]
    assert two.stop() == 0  # SIGTERM drains what is left, then exits 0
    assert no_process_left([pids["smol"], pids["emb"], restarted])


@pytest.fixture(scope="module")
def lazy(tmp_path_factory, model_dir):
    """tiny loaded at start; smol on demand; one loaded at a time; idle ones unloaded; keys."""
    folder = save_family("qwen3", tmp_path_factory.mktemp("tiny") / "tiny-qwen3", model_dir)
    log = tmp_path_factory.mktemp("lazy") / "server.log"
    server = LiveServer([sys.executable, "server.py", "--model", f"tiny={folder}",
                         "--model", "smol=SmolLM2-135M-Instruct", "--port", "{port}",
                         "--num-blocks", "64", "--max-loaded-models", "1",
                         "--idle-unload", "8", "--api-key", KEY,
                         "--single-thread-below", "0"], log, cwd=ROOT)  # (loads measure none)
    with server:
        yield server


def states(server: LiveServer) -> dict[str, str]:
    return httpx.get(f"{server.url}/health").json()["models"]


def no_process_left(pids: list[int], within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def tree_rss_kib(pid: int) -> int:
    """VmRSS of a process and its children, in KiB."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if stat.parent.name == str(pid) or int(fields[1]) == pid:
                status = (stat.parent / "status").read_text()
                total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        except (OSError, AttributeError):
            continue  # gone meanwhile
    return total


def streaming(url: str, model: str):
    """A long stream held open (its model busy) until the context closes."""
    return httpx.stream("POST", f"{url}/v1/chat/completions", headers=AUTH, timeout=120,
                        json={"model": model, "messages": HI, "max_tokens": 900,
                              "ignore_eos": True, "stream": True})


def test_a_request_for_an_unloaded_model_loads_it_once(lazy, server):
    """Three concurrent requests for the unloaded smol: one load, answers as smol served
    alone; tiny, the least recently used idle model, is unloaded to make room."""
    assert states(lazy) == {"tiny": "loaded", "smol": "unloaded"}
    cards = httpx.get(f"{lazy.url}/v1/models", headers=AUTH).json()["data"]
    assert {c["id"]: c["state"] for c in cards} == {"tiny": "loaded", "smol": "unloaded"}
    assert ask(lazy.url, "smol").status_code == 401  # keys still asked for
    tiny_pid = core_pids(lazy.log)["tiny"]
    alone = ask(server.url, None).json()["choices"][0]["message"]["content"]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: ask(lazy.url, "smol", key=KEY), range(3)))
    texts = [a.json()["choices"][0]["message"]["content"] for a in answers]
    print(texts, "alone:", alone)
    assert texts == [alone] * 3
    assert lazy.log.read_text().count("nano-vLLM: smol on") == 1  # one process start
    assert states(lazy) == {"tiny": "unloaded", "smol": "loaded"}
    assert no_process_left([tiny_pid])


def test_a_busy_model_is_never_unloaded(lazy):
    """Under --max-loaded-models 1, a request for tiny waits while smol has a request in
    flight, and loads tiny once that request is gone."""
    with ThreadPoolExecutor(1) as pool, streaming(lazy.url, "smol") as stream:
        assert next(stream.iter_lines()).startswith("data:")
        waiting = pool.submit(ask, lazy.url, "tiny", 8, KEY)
        time.sleep(2)
        assert not waiting.done() and states(lazy) == {"tiny": "unloaded", "smol": "loaded"}
        stream.close()
        assert waiting.result(timeout=60).status_code == 200
    assert states(lazy) == {"tiny": "loaded", "smol": "unloaded"}


def test_an_idle_model_is_unloaded_and_its_memory_given_back(lazy):
    """An open dashboard does not keep a model loaded: its stream ends with the model, and
    asks again (503) without loading it."""
    pid = core_pids(lazy.log)["tiny"]
    before = tree_rss_kib(lazy.proc.pid)
    watching = f"{lazy.url}/dashboard/events?model=tiny&api_key={KEY}"
    with httpx.stream("GET", watching, timeout=60) as stream:
        assert stream.status_code == 200
        frames = sum(1 for _ in sse_events(stream.iter_lines()))  # until the stream ends
    print(f"{frames} frames before the model was unloaded; {states(lazy)}")
    assert frames >= 1 and states(lazy)["tiny"] in ("unloading", "unloaded")
    deadline = time.monotonic() + 30  # --idle-unload 8
    while states(lazy)["tiny"] != "unloaded":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert no_process_left([pid])
    again = httpx.get(watching)
    assert again.status_code == 503 and again.headers["retry-after"]
    assert "watching does not load it" in again.json()["error"]["message"]
    assert httpx.get(f"{lazy.url}/dashboard/events?model=tiny").status_code == 401
    assert states(lazy)["tiny"] == "unloaded"
    after = tree_rss_kib(lazy.proc.pid)
    print(f"server and engine processes: {before} KiB loaded, {after} KiB unloaded")
    assert after < before - 50 * 1024  # the engine process's memory, given back


def test_operators_load_and_unload(lazy):
    url = f"{lazy.url}/v1/models"
    refused = httpx.post(f"{url}/smol/load")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(f"{url}/gpt-5/load", headers=AUTH).status_code == 404
    loaded = httpx.post(f"{url}/smol/load", headers=AUTH, timeout=120)
    assert loaded.json() == {"id": "smol", "object": "model", "state": "loaded"}
    with streaming(lazy.url, "smol") as stream:
        first = next(stream.iter_lines())
        print(stream.status_code, first[:200], states(lazy))
        busy = httpx.post(f"{url}/smol/unload", headers=AUTH)
        print(busy.json())
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "model_busy"
    pid = core_pids(lazy.log)["smol"]
    time.sleep(0.5)  # (the stream's end reaches the engine)
    unloaded = httpx.post(f"{url}/smol/unload", headers=AUTH, timeout=30)
    assert unloaded.json()["state"] == "unloaded" and no_process_left([pid])
    assert httpx.get(f"{url}/smol", headers=AUTH).json()["state"] == "unloaded"


def test_sigterm_drains_every_model_and_leaves_no_process(lazy):
    """A request the engine has taken in is answered whole; one still being taken in when the
    drain begins may be refused (503), as with one model."""
    body = {"model": "tiny", "messages": HI, "max_tokens": 400, "ignore_eos": True,
            "temperature": 0}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, f"{lazy.url}/v1/chat/completions", json=body,
                             headers=AUTH, timeout=120)
        deadline = time.monotonic() + 60
        while not re.search(r'num_requests_running\{model="tiny"\} [1-9]',
                            httpx.get(f"{lazy.url}/metrics", headers=AUTH).text):
            assert time.monotonic() < deadline and not answer.done()
            time.sleep(0.1)
        pids = list(core_pids(lazy.log).values())
        assert lazy.stop() == 0
        assert answer.result().status_code == 200
    assert no_process_left(pids)
