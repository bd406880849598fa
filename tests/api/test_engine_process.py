"""server.py's default: the engine core in a process of its own, behind the same API.

Real server processes (tests/api/test_lifecycle.py's helpers), started with no flag for
it: the answers match the in-process engine's token for token, and /v1/models says what it
says; samples, logprobs, structured outputs, /metrics and the dashboard's snapshots and
block details cross; stop strings, found in the API process, end the text as in-process and
the core frees their blocks; a client that leaves frees its blocks; SIGTERM drains and both
processes exit 0; a killed core fails its streams, the server answers 503 and exits for its
supervisor, and no process is left behind, also when the API process is killed; the
baseline's core runs in such a process too. One server serves the first tests, the last of
them stopping it; the others start their own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jsonschema
import pytest

from api.lifecycle import ENGINE_FAILURE_EXIT_CODE
from benchmarks.live_server import LiveServer
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.core import describe_threads
from tests.api.conftest import RunningServer
from tests.api.dashboard_load import PREFIX, QUESTIONS, shared_prefix_streams
from tests.api.test_dashboard import frames, shared_by_all
from tests.api.test_lifecycle import (
    COMPLETIONS,
    ROOT,
    START_TIMEOUT,
    StreamReader,
    small_server,
)
from tests.api.test_server import check_error, stream
from tests.api.test_structured_outputs import ASK, ITEM, schema_format
from tests.waiting import wait_for

CHAT = "/v1/chat/completions"


@dataclass
class ProcessServer:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def core_pid(self) -> int:
        return int(re.search(r"engine core in process (\d+)", self.log.read_text())[1])


def launch(log: Path, *flags: str) -> ProcessServer:
    live = small_server(log, *flags)  # the engine process is the default
    live.start()
    return ProcessServer(live.proc, live.url, log)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Iterator[ProcessServer]:
    server = launch(tmp_path_factory.mktemp("engine-process") / "server.log")
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def gone(pid: int) -> bool:
    """No such process (a zombie, exited and not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples (over its labels) in /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values = re.findall(rf"^nano_vllm:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert values, f"{name} not in /metrics:\n{text[:2000]}"
    return sum(float(v) for v in values)


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def streamed_chat(url: str, body: dict) -> tuple[str, list]:
    events = []
    with httpx.stream("POST", url + CHAT, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                data = line.removeprefix("data:").strip()
                events.append(data if data == "[DONE]" else json.loads(data))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if isinstance(e, dict) and e.get("choices"))
    return text, events


def test_the_core_chose_its_threads_and_left_no_trace(split):
    """First on this server: the core measured its thread threshold at start, or read it
    from the session's cache, or measured while another process was busy and did not cache
    it (the suite's own processes may be); either way no request, token or block of it
    shows."""
    text = split.log.read_text()
    line = (re.search(r"threads: (.*), (cached in|read from) (\S+)", text)
            or re.search(r"threads: other processes used .* not cached, .* this start uses (.*)$",
                         text, re.M))
    assert line, text[-3000:]
    print(line[0])
    chosen = re.search(r"1 below (\d+) tokens", line[1].split(" (measured")[0])
    threshold = int(chosen[1]) if chosen else 0
    # What the core runs with, in its start-up line (on however many threads it has).
    assert any(describe_threads(most, threshold) in text for most in range(1, 65))
    for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_running",
                 "kv_blocks_used", "kv_blocks_cached_free"):
        assert metric(split.url, name) == 0, name


def test_greedy_answers_match_the_in_process_engine(split, server: RunningServer):
    completion = {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Name three colors."}],
            "max_tokens": 24, "temperature": 0}
    theirs = post(server.url, COMPLETIONS, completion)["choices"][0]["text"]
    ours = post(split.url, COMPLETIONS, completion)["choices"][0]["text"]
    their_chat, _ = streamed_chat(server.url, chat)
    our_chat, events = streamed_chat(split.url, chat)
    print(f"completion {ours!r}\nchat {our_chat!r}")
    assert ours and ours == theirs
    assert our_chat and our_chat == their_chat
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] is not None


def test_samples_and_logprobs_cross(split, server: RunningServer):
    """n=2 seeded samples with logprobs: the same tokens and logprobs as in-process."""
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 7,
            "n": 2, "logprobs": 2}
    theirs, ours = post(server.url, COMPLETIONS, body), post(split.url, COMPLETIONS, body)
    assert len(ours["choices"]) == 2
    for mine, other in zip(ours["choices"], theirs["choices"], strict=True):
        print(mine["index"], repr(mine["text"]))
        assert mine["text"] == other["text"]
        assert mine["logprobs"]["tokens"] == other["logprobs"]["tokens"]
        assert len(mine["logprobs"]["top_logprobs"][0]) == 2
        assert mine["logprobs"]["token_logprobs"] == pytest.approx(
            other["logprobs"]["token_logprobs"], abs=1e-4)
    assert ours["choices"][0]["text"] != ours["choices"][1]["text"]  # two seeds, two answers


def test_structured_output_crosses(split):
    body = {"messages": ASK, "max_tokens": 80, "temperature": 0,
            "response_format": schema_format(ITEM)}
    choice = post(split.url, CHAT, body)["choices"][0]
    print(repr(choice["message"]["content"]))
    jsonschema.validate(json.loads(choice["message"]["content"]), ITEM)
    assert choice["finish_reason"] == "stop"


def test_the_default_is_two_processes(split):
    """No flag: the core runs in a child process of the server."""
    core = split.core_pid
    with open(f"/proc/{core}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    print(f"server {split.proc.pid}, core {core} (parent {parent})")
    assert core != split.proc.pid and parent == split.proc.pid


def test_models_says_what_the_in_process_engine_says(split, server: RunningServer, model,
                                                    tokenizer):
    """/v1/models: the architecture and context length that the core read from the model's
    config, as the in-process engine reports them, and the longest request the core's own
    pool holds (--num-blocks 64), as an in-process engine with that pool says."""
    r = httpx.get(split.url + "/v1/models", timeout=10)
    assert r.status_code == 200, r.text
    card = r.json()["data"][0]
    theirs = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    pool = BatchEngine(EngineConfig(num_blocks=64, max_num_seqs=4), model, tokenizer)
    print(card)
    assert card["model_type"] == server.engine.model_type == theirs["model_type"]
    assert card["max_position_embeddings"] == server.engine.max_position_embeddings
    assert card["max_position_embeddings"] == theirs["max_position_embeddings"]
    assert card["max_model_len"] == pool.max_tokens_per_request
    assert card["max_model_len"] < card["max_position_embeddings"]  # the pool's, not the model's
    assert card["id"] == theirs["id"] and card["object"] == "model"


def test_dashboard_snapshots_and_block_details_cross(split, tokenizer):
    """While three requests share a prefix: the snapshots the core sends show the shared
    blocks and the counters; a used block's details come from the snapshot, a cached-free
    block's (after the requests) from the core's pool."""
    prompt_ids = tokenizer(PREFIX + QUESTIONS[0]).input_ids
    with shared_prefix_streams(split.url, max_tokens=60):
        message = frames(split, shared_by_all)
        frame = message["frame"]
        shared = [b for b, ref in enumerate(frame["refs"]) if ref > 1]
        print(f"snapshot {frame['seq']} at step {frame['step']}: shared blocks {shared}; "
              f"counters {message['counters']}")
        assert frame["num_blocks"] == 64  # --num-blocks 64, the dummy block 0 included
        assert {frame["refs"][b] for b in shared} == {len(QUESTIONS)}
        assert message["counters"]["prompt_tokens"] >= len(prompt_ids)
        used = httpx.get(f"{split.url}/dashboard/blocks/{shared[1]}").json()
        print("a shared block:", used)
        assert used["state"] == "used" and used["ref_count"] == len(QUESTIONS)
        assert used["token_ids"] == prompt_ids[16:32] and used["position"] == 1

    def idle_with_cached_blocks(message: dict) -> bool:
        return not message["frame"]["requests"] and message["frame"]["cached_free"] > 0

    frame = frames(split, idle_with_cached_blocks)["frame"]
    assert frame["refs"][shared[1]] == -1, "the prefix's blocks stay findable"
    cached = httpx.get(f"{split.url}/dashboard/blocks/{shared[1]}").json()
    print("the same block, cached-free:", cached)
    assert cached["state"] == "cached" and cached["ref_count"] == 0 and not cached["owners"]
    assert cached["hash"] == used["hash"] and cached["parent_hash"] == used["parent_hash"]
    assert cached["token_ids"] == used["token_ids"] and cached["position"] == 1


def test_metrics_show_the_cores_counters(split):
    """One more finished request: one more success, its tokens in the core's counter. (A
    first request, so that request_success_total has a line to read: it has none until a
    request finished.)"""
    body = {"prompt": "Hi", "max_tokens": 5, "ignore_eos": True}
    post(split.url, COMPLETIONS, body)
    finished = metric(split.url, "request_success_total")
    generated = metric(split.url, "generation_tokens_total")
    post(split.url, COMPLETIONS, body)
    assert metric(split.url, "request_success_total") == finished + 1
    assert metric(split.url, "generation_tokens_total") == generated + 5
    assert metric(split.url, "kv_blocks_total") > 0


def straddling_stop(tokens: list[str]) -> tuple[str, int]:
    """A stop string made of the end of one token and the start of the next (the text's
    first occurrence of it), and how many tokens the text keeps up to the one completing
    it. One token a step: the stop string also straddles two steps."""
    joined = "".join(tokens)
    for k in range(len(tokens) // 3, len(tokens) - 1):
        left, right = tokens[k], tokens[k + 1]
        stop = left[-2:] + right[:2]
        if (len(left) >= 2 and len(right) >= 2 and stop.isascii() and stop.strip() == stop
                and joined.find(stop) == len("".join(tokens[:k + 1])) - 2):
            return stop, k + 2
    raise AssertionError(f"no two tokens to stop across in {tokens}")


def stop_across_tokens(url: str) -> tuple[dict, list[str], str, int, str]:
    """A greedy 24-token request to the server at `url`: its body, its tokens, a stop string
    across two of them (straddling_stop), how many tokens the text keeps, and that text."""
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True,
            "temperature": 0, "logprobs": 0}
    tokens = post(url, COMPLETIONS, body)["choices"][0]["logprobs"]["tokens"]
    stop, kept = straddling_stop(tokens)
    joined = "".join(tokens)
    return body, tokens, stop, kept, joined[:joined.find(stop)]


def finished_by_reason(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {reason: float(value) for reason, value in re.findall(
        r'^nano_vllm:request_success_total{finished_reason="(\w+)"} (\S+)$', text, re.M)}


def test_a_stop_string_across_tokens_ends_the_text_as_in_process(split, server: RunningServer):
    """Found in the API process, the stop string cuts the text, the tokens and their
    logprobs where the in-process engine does; a stream ends once, with "stop"."""
    body, tokens, stop, kept, expected = stop_across_tokens(server.url)
    print(f"tokens {tokens}\nstop {stop!r}: expect {expected!r} in {kept} tokens")
    body["stop"] = [stop]
    theirs, ours = post(server.url, COMPLETIONS, body), post(split.url, COMPLETIONS, body)
    for answer in (theirs, ours):
        choice = answer["choices"][0]
        assert choice["text"] == expected and choice["finish_reason"] == "stop"
        assert answer["usage"]["completion_tokens"] == kept
        assert choice["logprobs"]["tokens"] == tokens[:kept]
    assert ours["choices"][0]["logprobs"] == theirs["choices"][0]["logprobs"]
    events = stream(split, COMPLETIONS, body)
    print("stream:", [e["choices"][0]["text"] for e in events])
    assert "".join(e["choices"][0]["text"] for e in events) == expected
    assert [e["choices"][0]["finish_reason"] for e in events
            if e["choices"][0]["finish_reason"]] == ["stop"]


@pytest.mark.parametrize("past", [0, 1])
def test_a_stop_string_on_the_last_token_allowed_ends_the_text_once_as_stop(
        split, server: RunningServer, past: int):
    """max_tokens is the token that completes the stop string (past=0: the core ends the
    sample by length in the very step in which the API process finds the stop string), or
    one more (past=1: the core, stepping on, mostly ends it by length before it reads the
    EndSample). Either way "stop" with the text before the stop string, as in-process; one
    last output, counted once; and the core frees the blocks."""
    body, _, stop, kept, expected = stop_across_tokens(server.url)
    body = {**body, "max_tokens": kept + past, "stop": [stop]}
    print(f"stop {stop!r} completes at token {kept}; max_tokens {kept + past}")
    wait_for(lambda: metric(split.url, "kv_blocks_used") == 0)
    reasons = finished_by_reason(split.url)
    generated = metric(split.url, "generation_tokens_total")
    theirs, ours = post(server.url, COMPLETIONS, body), post(split.url, COMPLETIONS, body)
    events = stream(split, COMPLETIONS, body)
    for answer in (theirs, ours):
        choice = answer["choices"][0]
        assert choice["text"] == expected and choice["finish_reason"] == "stop"
        assert answer["usage"]["completion_tokens"] == kept
    assert "".join(e["choices"][0]["text"] for e in events) == expected
    assert [e["choices"][0]["finish_reason"] for e in events
            if e["choices"][0]["finish_reason"]] == ["stop"]
    wait_for(lambda: metric(split.url, "kv_blocks_used") == 0
             and metric(split.url, "num_requests_running") == 0, timeout=15)
    after = finished_by_reason(split.url)
    beyond = metric(split.url, "generation_tokens_total") - generated - 2 * kept
    print(f"finished {reasons} -> {after}; the core generated {beyond:g} tokens past the "
          f"stop string in the two requests (each one: it ended the sample by length)")
    assert after.get("stop", 0) == reasons.get("stop", 0) + 2
    assert 0 <= beyond <= 2 * past
    assert sum(after.values()) == sum(reasons.values()) + 2


def test_samples_with_a_stop_string_match_the_in_process_engine(split, server: RunningServer):
    """n=3 seeded samples, each ended by its own stop string (or by length) in the API
    process: the same texts, tokens and logprobs as in-process."""
    body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "seed": 3,
            "n": 3, "logprobs": 1, "stop": ["e"]}
    theirs, ours = post(server.url, COMPLETIONS, body), post(split.url, COMPLETIONS, body)
    for mine, other in zip(ours["choices"], theirs["choices"], strict=True):
        print(mine["index"], repr(mine["text"]), mine["finish_reason"])
        assert mine["text"] == other["text"] and "e" not in mine["text"]
        assert mine["finish_reason"] == other["finish_reason"]
        assert mine["logprobs"]["tokens"] == other["logprobs"]["tokens"]
    assert [c["finish_reason"] for c in ours["choices"]].count("stop") >= 2
    assert ours["usage"] == theirs["usage"]


def test_the_core_frees_the_blocks_of_a_request_a_stop_string_ended(split):
    """A stop string early in a long request: the API ends it, the core frees its blocks
    and seat (its own gauges say so) having generated at most a few tokens past it, and
    the request counts once, as stopped."""
    body = {"prompt": "Tell me a story", "max_tokens": 12, "ignore_eos": True,
            "temperature": 0, "logprobs": 0}
    tokens = post(split.url, COMPLETIONS, body)["choices"][0]["logprobs"]["tokens"]
    stop, kept = straddling_stop(tokens)
    wait_for(lambda: metric(split.url, "kv_blocks_used") == 0)
    reasons = finished_by_reason(split.url)
    generated = metric(split.url, "generation_tokens_total")
    answer = post(split.url, COMPLETIONS, {**body, "max_tokens": 400, "stop": [stop]})
    assert answer["usage"]["completion_tokens"] == kept
    assert answer["choices"][0]["finish_reason"] == "stop"
    wait_for(lambda: metric(split.url, "kv_blocks_used") == 0
             and metric(split.url, "num_requests_running") == 0, timeout=15)
    after = finished_by_reason(split.url)
    past = metric(split.url, "generation_tokens_total") - generated - kept
    print(f"stop {stop!r} after {kept} tokens; the core generated {past:g} more; "
          f"finished {reasons} -> {after}")
    assert after.get("stop", 0) == reasons.get("stop", 0) + 1
    assert sum(after.values()) == sum(reasons.values()) + 1
    assert 0 <= past <= 10


def test_a_client_that_leaves_frees_its_blocks(split):
    with httpx.stream("POST", split.url + COMPLETIONS, timeout=60,
                      json={"prompt": "Tell me a story", "max_tokens": 500,
                            "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        seen = 0
        while seen < 3:
            seen += next(lines).startswith("data:")
        assert metric(split.url, "kv_blocks_used") > 0
    wait_for(lambda: metric(split.url, "kv_blocks_used") == 0
             and metric(split.url, "num_requests_running") == 0, timeout=15)
    assert metric(split.url, "request_success_total") >= 1


def test_sigterm_drains_then_both_processes_exit_zero(split):
    """(Last on the shared server: it stops it.) The stream in flight gets every token."""
    core = split.core_pid
    stream = StreamReader(split.url, {"prompt": "One", "max_tokens": 30, "ignore_eos": True})
    wait_for(lambda: len(stream.texts()) >= 2)
    split.proc.send_signal(signal.SIGTERM)
    stream.join(timeout=60)
    rc = split.proc.wait(timeout=30)
    output = split.log.read_text()
    print(output[-3000:])
    assert stream.error() is None and len(stream.texts()) == 30
    assert stream.events[-2]["choices"][0]["finish_reason"] == "length"
    assert rc == 0
    assert "the engine core process exited with status 0" in output
    assert re.search(r"stopped: 0 requests in flight; KV blocks used 0,", output), output
    wait_for(lambda: gone(core), timeout=5)


def test_a_killed_core_fails_its_streams_and_ends_the_server(tmp_path):
    """kill -9 of the core: the stream ends with an error event within seconds, a new
    request gets a 503 in OpenAI's envelope, the server exits with status 70, and no
    process is left."""
    server = launch(tmp_path / "server.log")
    core = server.core_pid
    try:
        stream = StreamReader(server.url, {"prompt": "Once", "max_tokens": 500,
                                           "ignore_eos": True})
        wait_for(lambda: len(stream.texts()) >= 2)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.get("/health")  # the connection is open before the kill
            killed = time.monotonic()
            os.kill(core, signal.SIGKILL)
            r = client.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 2})
        stream.join(timeout=30)
        rc = server.proc.wait(timeout=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    print(server.log.read_text()[-3000:])
    error = stream.error()
    print(f"stream: {len(stream.texts())} chunks, then {error} after "
          f"{stream.ended - killed:.2f} s; new request: {r.status_code} {r.text}; exit {rc}")
    assert error is not None and error["code"] == "engine_failed"
    assert "SIGKILL" in error["message"]
    assert stream.events[-1] == "[DONE]" and stream.ended - killed < 5
    # Sent at once, it either reached the core before its death was noticed (and ended
    # with it) or was refused after: both are 503s.
    assert check_error(r, 503, "server_error")["code"] in ("engine_failed", "service_unavailable")
    assert rc == ENGINE_FAILURE_EXIT_CODE
    wait_for(lambda: gone(core), timeout=5)


def test_the_core_exits_when_the_server_is_killed(tmp_path):
    """kill -9 of the API process, which can drain nothing: its core notices and exits."""
    server = launch(tmp_path / "server.log")
    core = server.core_pid
    server.proc.kill()
    server.proc.wait()
    wait_for(lambda: gone(core), timeout=5)


def test_a_core_still_loading_exits_when_the_server_is_killed(tmp_path):
    """kill -9 of the server while its core loads (a first start compiles the kernels for a
    minute): the core exits at once, not when its loading ends."""
    mark = tmp_path / "importing"
    core_argv = [sys.executable, "-m", "engine.process.loop", "--config", "{}",
                 "--core", "tests.api.slow_core:Core",
                 *(f"--{name}=ipc://{tmp_path}/{name}" for name in ("requests", "outputs",
                                                                    "metrics"))]
    server = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "print(subprocess.Popen(sys.argv[1:]).pid, flush=True); time.sleep(120)", *core_argv],
        cwd=ROOT, env={**os.environ, "SLOW_CORE_MARK": str(mark), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, text=True)
    core = int(server.stdout.readline())
    try:
        wait_for(mark.exists, timeout=60)
        server.kill()
        server.wait()
        wait_for(lambda: gone(core), timeout=5)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
        if not gone(core):
            os.kill(core, signal.SIGKILL)


def test_the_baseline_core_runs_in_a_core_process(tmp_path, server: RunningServer):
    """baseline_server.py behind the same front end: its core in a process of its own, an
    answer, /v1/models as the in-process engine says, and no pool for the dashboard."""
    log = tmp_path / "baseline.log"
    argv = [sys.executable, "baseline_server.py", "--port", "{port}", "--max-num-seqs", "2"]
    with LiveServer(argv, log, cwd=ROOT, start_timeout=START_TIMEOUT) as live:
        core = ProcessServer(live.proc, live.url, log).core_pid
        answer = post(live.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 3,
                                              "ignore_eos": True})
        dashboard = httpx.get(live.url + "/dashboard/events", timeout=10)
        models = httpx.get(live.url + "/v1/models", timeout=10)
    print(log.read_text()[-1500:])
    print(answer["usage"], dashboard.status_code, dashboard.text, models.text)
    assert core != live.proc.pid and answer["usage"]["completion_tokens"] == 3
    assert models.status_code == 200, models.text
    card = models.json()["data"][0]
    assert card["model_type"] == server.engine.model_type
    # No pool: the baseline holds a request as long as the model's context.
    assert card["max_position_embeddings"] == card["max_model_len"] == (
        server.engine.max_position_embeddings)
    assert check_error(dashboard, 404, "not_found_error")
    wait_for(lambda: gone(core), timeout=5)
