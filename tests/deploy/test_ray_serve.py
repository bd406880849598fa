"""nano-vLLM replicas on a local Ray Serve cluster (deploy/): two replicas, one thread and a
small KV pool each, short generations. One cluster for the whole module.

Ray is an optional install (requirements-ray.txt): without it these tests are skipped, except
on CI (CI=true), which installs it, so a missing Ray fails there.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

if os.environ.get("CI") == "true":
    import ray
else:
    ray = pytest.importorskip("ray")
from ray import serve

from api.security import AccessConfig
from benchmarks.live_server import DONE, free_port, sse_events
from deploy.app import build_app
from deploy.ingress import routing_text
from deploy.ray_serve import APP_NAME, REPO_ROOT
from deploy.replica import REPLICA_HEADER, REPLICA_PID_HEADER, Front
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from tests.api.conftest import MODEL_NAME
from tests.api.conftest import serve as serve_single
from tests.api.test_server import stream

# Ray's own config models use a pydantic feature deprecated in v2: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPLICAS = 2
# Small on purpose: a replica's pool holds one group's system prompt (20 blocks) and the
# request on top, not two groups' prompts, as a busy server's cache would not.
NUM_BLOCKS = 32
REPLICA_CONFIG = EngineConfig(num_blocks=NUM_BLOCKS, threads=1, max_num_seqs=4)
WAIT_S = 120  # bound on every wait for the cluster


@dataclass
class Endpoint:
    url: str


def deploy(router: str, endpoint: Endpoint | None = None, front: Front | None = None,
           headers: dict[str, str] | None = None) -> None:
    """(Re)deploy the app with fresh replicas; with `endpoint`, return only once requests
    (with `headers`) reach both (the ingress learns of new replicas a moment after they
    run)."""
    serve.run(build_app(REPLICA_CONFIG, MODEL_NAME, REPLICAS, router, front=front),
              name=APP_NAME, route_prefix="/")
    deadline, seen = time.monotonic() + WAIT_S, set()
    while endpoint is not None and len(seen) < REPLICAS:
        assert time.monotonic() < deadline, f"requests reached only {seen}"
        with ThreadPoolExecutor(REPLICAS * 2) as pool:  # together: the least loaded differs
            answers = list(pool.map(lambda _: complete(endpoint, "Hi", max_tokens=1,
                                                       headers=headers),
                                    range(REPLICAS * 2)))
        seen |= {r.headers.get(REPLICA_HEADER) for r in answers if r.status_code == 200}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Endpoint]:
    ray.init(num_cpus=REPLICAS, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        endpoint = Endpoint(f"http://127.0.0.1:{port}")
        deploy("prefix", endpoint)
        yield endpoint
    finally:
        serve.shutdown()
        ray.shutdown()


def complete(endpoint: Endpoint, prompt: str, max_tokens: int = 2,
             timeout: float = WAIT_S, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(endpoint.url + "/v1/completions", timeout=timeout, headers=headers,
                      json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0})


def engine_replicas_running() -> int:
    app = serve.status().applications[APP_NAME]
    return app.deployments["EngineReplica"].replica_states.get("RUNNING", 0)


# --- the router's input ------------------------------------------------------------------------


def test_routing_text_is_the_prompt() -> None:
    assert routing_text("/v1/completions", b'{"prompt": "Hello there"}') == "Hello there"
    assert routing_text("/v1/completions", b'{"prompt": ["first", "second"]}') == "first"
    assert routing_text("/v1/completions", b'{"prompt": [1, 2, 3]}') == "1 2 3 "
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert routing_text("/v1/chat/completions", json.dumps(chat).encode()) == (
        "<system>Be brief.\n<user>Hi\n")
    assert routing_text("/v1/completions", b"not json") == ""
    assert routing_text("/v1/models", b"") == ""


def test_the_serve_config_file_builds_the_app() -> None:
    """deploy/serve_config.yaml (for `serve deploy` and KubeRay) names a builder that works."""
    import yaml

    from deploy.app import app_builder

    config = yaml.safe_load((REPO_ROOT / "deploy" / "serve_config.yaml").read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "deploy.app:app_builder"
    assert type(app_builder(application["args"])).__name__ == "Application"
    with pytest.raises(ValueError, match="replica"):
        app_builder({"replica": "2"})
    for flag in ("--port 9000", "--host=0.0.0.0"):  # http_options decide: not dropped
        with pytest.raises(ValueError, match="http_options"):
            app_builder({"engine_args": flag})


def test_replicas_run_their_engine_in_process() -> None:
    """Each replica's engine is on a thread of its actor: the in-process thread default, and
    the engine-process flags refused rather than ignored."""
    from deploy.app import replica_engine_config
    from server import build_parser

    args = build_parser(None).parse_args([])
    assert replica_engine_config(args, []).single_thread_below == 16
    for argv in (["--engine-process"], ["--engine-cpus", "1"]):
        with pytest.raises(ValueError, match="Ray actor process") as refused:
            replica_engine_config(build_parser(None).parse_args(argv), argv)
        print(argv, "->", refused.value)


@pytest.mark.parametrize("argv", [["--shutdown-timeout", "5"], ["--shutdown-timeout=5"],
                                  ["--no-exit-on-engine-failure"]])
def test_process_exit_flags_are_refused_not_dropped(argv) -> None:
    """The flags that stop server.py's own process do nothing where Ray Serve stops and
    replaces the replicas: an error, not a flag that seems to work."""
    from deploy.app import replica_engine_config
    from server import build_parser

    with pytest.raises(ValueError, match=f"{argv[0].split('=')[0]} is not supported") as refused:
        replica_engine_config(build_parser(None).parse_args(argv), argv)
    print(argv, "->", refused.value)


def test_an_abbreviated_flag_is_not_taken() -> None:
    """argparse takes "--shutdown-t" for --shutdown-timeout unless told not to: the Ray paths
    refuse it."""
    from deploy.app import app_builder
    from deploy.ray_serve import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["--shutdown-t", "5"])
    with pytest.raises(SystemExit):
        app_builder({"engine_args": "--shutdown-t 5"})


def test_the_front_flags_reach_the_replicas(monkeypatch) -> None:
    """Keys (flags and $NANO_VLLM_API_KEY), CORS origins and the body limit are read as
    server.py reads them, with its errors."""
    from deploy.replica import Front
    from server import build_parser

    monkeypatch.setenv("NANO_VLLM_API_KEY", "k2")
    front = Front.from_args(build_parser(None).parse_args(
        ["--api-key", "k1", "--protect-health-metrics", "--allowed-origins", "https://a.example",
         "--max-request-bytes", "5000"]))
    assert front.access.api_keys == ("k1", "k2") and front.access.protect_health_metrics
    assert front.access.allowed_origins == ("https://a.example",)
    assert front.max_request_bytes == 5000
    with pytest.raises(ValueError, match="max-request-bytes"):
        Front.from_args(build_parser(None).parse_args(["--max-request-bytes", "0"]))


# --- through the cluster -----------------------------------------------------------------------


def test_streaming_matches_the_single_server(cluster: Endpoint, model, tokenizer) -> None:
    body = {"model": MODEL_NAME, "prompt": "The cat sat on the", "max_tokens": 12,
            "temperature": 0}
    through_ray = [e["choices"][0]["text"] for e in stream(cluster, "/v1/completions", body)]
    single = BatchEngine(EngineConfig(num_blocks=64), model, tokenizer)
    for server in serve_single(single):
        alone = [e["choices"][0]["text"] for e in stream(server, "/v1/completions", body)]
    print("ray:", through_ray, "\nsingle:", alone)
    assert len(through_ray) == 12
    assert through_ray == alone


def test_errors_come_back_in_the_envelope(cluster: Endpoint) -> None:
    r = complete(cluster, "")
    print(r.status_code, r.text)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"
    assert r.headers[REPLICA_HEADER]  # answered by a replica's own app


def test_killed_replica_fails_its_requests_and_comes_back(cluster: Endpoint) -> None:
    # Long enough for the router to match (two chunks): both requests go to one replica.
    prompt = ("Write a long story about a lighthouse keeper, the sea, the storms of one "
              "winter, and the ships she guided home through the fog of that northern coast.")
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 400, "temperature": 0,
            "stream": True}
    plain: dict[str, Any] = {}

    def non_streamed() -> None:
        # The same prompt, sent once the stream has started: the router matches its two
        # chunks to the stream's replica (one request in flight there, within the imbalance
        # allowed), so it is certainly in flight on the replica killed below.
        r = complete(cluster, prompt, max_tokens=400)
        plain.update(status=r.status_code, body=r.json(), replica=r.headers.get(REPLICA_HEADER))

    events: list = []
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        killed, pid = r.headers[REPLICA_HEADER], int(r.headers[REPLICA_PID_HEADER])
        thread = threading.Thread(target=non_streamed)
        stream = sse_events(r.iter_lines())
        for event in stream:
            events.append(event)
            if len(events) == 1:
                thread.start()
            if len(events) == 8:
                break
        time.sleep(0.5)  # the non-streamed request is in flight on that replica too
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        events.extend(stream)
        print(f"stream ended {time.monotonic() - t0:.1f} s after the kill; last events:",
              events[-2:])
    thread.join(WAIT_S)
    print("non-streamed:", plain)
    assert events[-1] == DONE
    error = events[-2]["error"]
    assert error["type"] == "server_error" and "replica" in error["message"]
    assert len(events) < 400  # it did not finish
    assert plain["status"] == 503, plain  # not answered by the survivor: it was on the killed one
    assert plain["replica"] is None  # the ingress's own answer
    assert plain["body"]["error"]["type"] == "server_error"
    assert "replica" in plain["body"]["error"]["message"]

    served_by = [complete(cluster, f"After the kill, request {i}:") for i in range(3)]
    print("after the kill:", [(r.status_code, r.headers.get(REPLICA_HEADER)) for r in served_by])
    assert all(r.status_code == 200 for r in served_by)
    survivors = {r.headers[REPLICA_HEADER] for r in served_by}
    assert killed not in survivors

    # The replacement is up once it answers: each prompt new, so the router (least loaded,
    # then the replica sent a request longest ago) turns to the new replica once it knows it.
    deadline, i = time.monotonic() + WAIT_S, 0
    while True:
        r = complete(cluster, f"Prompt {i} sent after the kill, until a new replica answers "
                              "it; long enough to be remembered by the router.")
        if r.status_code == 200 and r.headers[REPLICA_HEADER] not in survivors | {killed}:
            break
        assert time.monotonic() < deadline, "the killed replica was not replaced"
        time.sleep(0.5)
        i += 1
    print(f"replaced by {r.headers[REPLICA_HEADER]}: answering {time.monotonic() - t0:.1f} s "
          "after the kill")
    assert engine_replicas_running() == REPLICAS


# After the controller reports the replacement running, the ingress hears of it within about
# a second (Ray's long poll); the next request with no remembered prefix must then go to it.
BOTH_SERVE_WITHIN_S = 10.0


def engine_replica_states() -> dict[str, int]:
    app = serve.status().applications[APP_NAME]
    return dict(app.deployments["EngineReplica"].replica_states)


def wait_for_replacement() -> None:
    """Until the controller has seen the kill (its replica no longer counted as running) and
    then reports every replica running again."""
    settled = {"RUNNING": REPLICAS}
    for what, done in (("see the kill", lambda: engine_replica_states() != settled),
                       ("replace the replica", lambda: engine_replica_states() == settled)):
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"the controller did not {what}: " \
                f"{engine_replica_states()}"
            time.sleep(0.2)


def test_a_replacement_replica_serves_at_once(cluster: Endpoint) -> None:
    """Kill a replica, then send short, unrelated prompts one at a time (never a remembered
    prefix, never two in flight: equal load at every choice). Once the replacement runs,
    both it and the survivor must serve within BOTH_SERVE_WITHIN_S. Twice: first a replica
    from before, then the replacement itself (the newest), so the one killed is once the
    older and once the younger of the two."""
    victim: str | None = None
    pids: dict[str, int] = {}
    for kill in range(2):
        deadline = time.monotonic() + WAIT_S
        while len(pids) < REPLICAS or (victim is not None and victim not in pids):
            assert time.monotonic() < deadline, f"requests reached only {sorted(pids)}"
            prompts = [f"Kill {kill}: who is there? {i}" for i in range(REPLICAS * 2)]
            with ThreadPoolExecutor(REPLICAS * 2) as pool:  # together: the least loaded differs
                answers = list(pool.map(lambda p: complete(cluster, p, max_tokens=1), prompts))
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            pids.update((r.headers[REPLICA_HEADER], int(r.headers[REPLICA_PID_HEADER]))
                        for r in answers)
        victim = victim or next(iter(pids))
        survivor = next(name for name in pids if name != victim)
        os.kill(pids[victim], signal.SIGKILL)
        t_kill = time.monotonic()
        wait_for_replacement()
        t_up = time.monotonic()
        served: list[str] = []
        while time.monotonic() - t_up < BOTH_SERVE_WITHIN_S:
            r = complete(cluster, f"Kill {kill}, request {len(served)}: say hi.", max_tokens=1)
            assert r.status_code == 200, r.text
            served.append(r.headers[REPLICA_HEADER])
            if len(set(served)) == REPLICAS:
                break
            time.sleep(0.2)
        print(f"kill {kill}: {victim} killed; running again {t_up - t_kill:.1f} s later; "
              f"then served by {served} in {time.monotonic() - t_up:.1f} s")
        assert victim not in served
        assert survivor in served and len(set(served)) == REPLICAS, (
            f"not both replicas served within {BOTH_SERVE_WITHIN_S} s: {served}")
        victim = next(name for name in served if name != survivor)  # next: the replacement
        pids = {survivor: pids[survivor]}


def group_prompts(topic: str, rules: list[str]) -> str:
    """A long system prompt (about 20 KV blocks: two do not fit in one replica's pool)
    shared by one group of requests."""
    lines = [f"{i + 1}. {rule}" for i, rule in enumerate(rules * 8)]
    return f"System: you are the {topic} assistant. Follow these rules.\n" + "\n".join(lines)


SYSTEM_PROMPTS = {
    "astronomy": group_prompts("astronomy", [
        "Explain planets, stars and galaxies in plain words.",
        "Give distances in light years and kilometres.",
        "Mention which telescope made an observation when it matters.",
    ]),
    "cooking": group_prompts("cooking", [
        "Give quantities in grams and cups for every ingredient.",
        "Warn about allergens such as nuts, gluten and shellfish.",
        "State oven temperatures in Celsius and Fahrenheit.",
    ]),
}
QUESTIONS = ["Question {}: what should I know first?", "Question {}: give me one tip.",
             "Question {}: what is a common mistake?", "Question {}: answer briefly.",
             "Question {}: why does it matter?", "Question {}: one more fact, please."]


def shared_prefix_tokens(tokenizer) -> int:
    """Whole KV blocks two requests of one group share: the most a prefix hit can reuse."""
    shortest = 1 << 30
    for system in SYSTEM_PROMPTS.values():
        first, second = (tokenizer(f"{system}\n{q.format(i)}")["input_ids"]
                         for i, q in enumerate(QUESTIONS[:2]))
        same = next(n for n, (a, b) in enumerate(zip([*first, -1], [*second, -2])) if a != b)
        shortest = min(shortest, same // 16 * 16)
    return shortest


def run_groups(endpoint: Endpoint, prefix_tokens: int) -> tuple[int, int, list[str]]:
    """Both groups' requests, interleaved; (requests after each group's first that found its
    system prompt cached, how many such requests, where each went)."""
    hits, later, placements = 0, 0, []
    for i, question in enumerate(QUESTIONS):
        for group, system in SYSTEM_PROMPTS.items():
            r = complete(endpoint, f"{system}\n{question.format(i)}")
            assert r.status_code == 200, r.text
            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            placements.append(f"{group[0]}->{r.headers[REPLICA_HEADER]}:{cached}")
            if i > 0:
                later += 1
                hits += cached >= prefix_tokens
    return hits, later, placements


def test_prefix_routing_keeps_each_group_on_its_replica(cluster: Endpoint, tokenizer) -> None:
    """Runs after the kills above, on a survivor and a replacement: where the CI once saw
    both groups sent to one replica, evicting each other."""
    prefix_tokens = shared_prefix_tokens(tokenizer)
    prefix_hits, later, prefix_placed = run_groups(cluster, prefix_tokens)
    print(f"shared prefix {prefix_tokens} tokens; replica pool {NUM_BLOCKS} blocks")
    print(f"prefix-aware router: {prefix_hits}/{later} later requests hit their group's "
          f"prefix; placements {prefix_placed}")
    for group in "ac":
        replicas = Counter(p.split("->")[1].split(":")[0] for p in prefix_placed
                           if p.startswith(group))
        assert replicas.most_common(1)[0][1] >= len(QUESTIONS) - 1, replicas
    # A replica's pool holds one group's system prompt, not two: a request hits only if its
    # group's previous request went to the same replica and the other group's did not go
    # there in between. So all but one of the later requests hitting is only possible if
    # the groups were kept apart, whatever the timing or the order Ray lists replicas in. No
    # comparison with Ray's power-of-two router: between idle replicas it picks at random,
    # so it keeps the groups apart by luck now and then (each placement is a coin toss), and
    # "it hit fewer" would fail by chance.
    assert prefix_hits >= later - 1


def test_keys_cors_and_the_body_limit_hold_behind_the_ingress(cluster: Endpoint) -> None:
    """server.py's front flags, on the replicas: a key is needed (in either header), /health
    is open or not as asked, a CORS preflight from an allowed origin is answered, and a body
    over the limit is a 413 from the ingress itself, no replica reached. Redeploys, then
    puts the default app back."""
    origin, key, limit = "https://app.example", "sekret", 20_000
    front = Front(AccessConfig(api_keys=(key,), allowed_origins=(origin,)), limit)
    deploy("prefix", cluster, front, headers={"Authorization": f"Bearer {key}"})
    try:
        refused = complete(cluster, "Hi")
        print(refused.status_code, refused.text)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert complete(cluster, "Hi", headers={"x-api-key": key}).status_code == 200
        assert httpx.get(cluster.url + "/health", timeout=WAIT_S).status_code == 200
        preflight = httpx.options(cluster.url + "/v1/completions", timeout=WAIT_S, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        print(preflight.status_code, dict(preflight.headers))
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        answer = complete(cluster, "Hi", headers={"x-api-key": key, "Origin": origin})
        assert answer.headers.get_list("access-control-allow-origin") == [origin]  # once
        big = httpx.post(cluster.url + "/v1/completions", timeout=WAIT_S,
                         headers={"Authorization": f"Bearer {key}", "Origin": origin},
                         json={"model": MODEL_NAME, "prompt": "x" * limit, "max_tokens": 1})
        print(big.status_code, big.text, dict(big.headers))
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        assert REPLICA_HEADER not in big.headers  # the ingress answered
        assert big.headers["access-control-allow-origin"] == origin  # a browser can read it
        head = httpx.head(cluster.url + "/health", timeout=WAIT_S)
        assert head.status_code == 200 and head.content == b""
    finally:
        deploy("prefix", cluster)
