"""API keys and CORS (api/security.py), on the app in-process over a fake engine: who gets
in is decided before any engine work, so none is needed."""

from __future__ import annotations

import contextlib

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.security import API_KEY_ENV, AccessConfig, APIKeyCheck
from server import build_parser

KEYS = ("key-one", "key-two")


class FakeMetrics:
    def render(self) -> bytes:
        return b"# nothing\n"


class FakeEngine:
    """Enough of api/engine_client.py's EngineClient for routes that generate nothing."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.metrics = FakeMetrics()
        self.max_tokens_per_request = 2048
        self.model_type = "llama"
        self.max_position_embeddings = 8192
        self.max_num_seqs = 4
        self.is_alive = True
        self.unavailable_reason = None
        self.scheduling_policy = "fcfs"
        self.snapshots = None  # no dashboard to show
        self.embedding_info = None  # a model that generates

    def add_request(self, request) -> None:
        raise AssertionError("an unauthenticated request reached the engine")

    def abort(self, request_id: str) -> None:
        pass

    def cached_block(self, block_id: int) -> None:
        return None

    def outputs_on(self, loop) -> contextlib.nullcontext:
        return contextlib.nullcontext()


def client_for(tokenizer, **access) -> TestClient:
    return TestClient(create_app(FakeEngine(tokenizer), "m", AccessConfig(**access)))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def check_401(r) -> dict:
    print(r.status_code, r.headers.get("www-authenticate"), r.text)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Bearer"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    return error


def test_keys_guard_the_api(tokenizer):
    c = client_for(tokenizer, api_keys=KEYS)
    assert "No API key" in check_401(c.get("/v1/models"))["message"]
    assert "Incorrect" in check_401(c.get("/v1/models", headers=bearer("key-three")))["message"]
    check_401(c.get("/v1/models", headers={"Authorization": "Basic key-one"}))
    check_401(c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}))
    check_401(c.post("/v1/chat/completions", json={"messages": []}))  # before validation
    check_401(c.post("/tokenize", json={"prompt": "Hi"}, headers=bearer("key-on")))  # a prefix
    check_401(c.get("/v1/models/default"))
    check_401(c.get("/v1/models/no-such-model"))  # the key first: no model names leak
    for key in KEYS:  # each key works, the scheme's case does not matter
        assert c.get("/v1/models", headers=bearer(key)).status_code == 200
        r = c.post("/tokenize", json={"prompt": "Hi"},
                   headers={"Authorization": f"bearer {key}"})
        assert r.status_code == 200, r.text
    # Open by default, for load balancers and Prometheus; the document needs no key.
    for path in ("/health", "/metrics", "/openapi.json"):
        assert c.get(path).status_code == 200, path


def test_keys_can_guard_health_and_metrics(tokenizer):
    c = client_for(tokenizer, api_keys=KEYS, protect_health_metrics=True)
    for path in ("/health", "/metrics"):
        check_401(c.get(path))
        assert c.get(path, headers=bearer(KEYS[1])).status_code == 200


def test_no_keys_no_guard(tokenizer):
    c = client_for(tokenizer)
    assert c.get("/v1/models").status_code == 200
    assert c.get("/v1/models", headers=bearer("anything")).status_code == 200
    assert "securitySchemes" not in c.get("/openapi.json").json()["components"]


def test_keys_from_flags_and_environment():
    parser = build_parser(None)
    args = parser.parse_args(["--api-key", "a", "--api-key", "b", "--protect-health-metrics"])
    access = AccessConfig.from_args(args, environ={API_KEY_ENV: " c, a ,"})
    print(access)
    assert access.api_keys == ("a", "b", "c") and access.protect_health_metrics
    env_only = AccessConfig.from_args(parser.parse_args([]), environ={API_KEY_ENV: "e"})
    assert env_only.api_keys == ("e",) and not env_only.protect_health_metrics
    assert AccessConfig.from_args(parser.parse_args([]), environ={}).api_keys == ()
    with pytest.raises(ValueError, match="empty"):
        AccessConfig.from_args(parser.parse_args(["--api-key", " "]), environ={})
    with pytest.raises(ValueError, match="protect-health-metrics"):
        AccessConfig.from_args(parser.parse_args(["--protect-health-metrics"]), environ={})


def test_key_check():
    check = APIKeyCheck(KEYS)
    assert check.allows("Bearer key-two") and check.allows("BEARER  key-one ")
    for header in (None, "", "Bearer", "Bearer ", "key-one", "Bearer key-one2", "Token key-one"):
        assert not check.allows(header), header
    assert APIKeyCheck(()).allows(None)


def test_cors(tokenizer):
    origin = "https://app.example.com"
    c = client_for(tokenizer, api_keys=KEYS, allowed_origins=(origin,))
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    r = c.options("/v1/completions", headers=preflight)  # no key: browsers send none here
    print(r.status_code, dict(r.headers))
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == origin
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = c.get("/v1/models", headers={"Origin": origin, **bearer(KEYS[0])})
    assert r.headers["access-control-allow-origin"] == origin
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
    r = c.options("/v1/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    # Without --allowed-origins no CORS header is sent at all.
    plain = client_for(tokenizer).get("/v1/models", headers={"Origin": origin})
    assert "access-control-allow-origin" not in plain.headers
