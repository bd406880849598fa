"""Who may call the server: API keys (`Authorization: Bearer KEY`, or `x-api-key: KEY` as
Anthropic's clients send it) and browsers from other origins (CORS).

Keys come from `--api-key` (repeatable) and from NANO_VLLM_API_KEY (several separated by
commas). With none, every route is open. With some, every route needs one, except
/openapi.json, and /health and /metrics unless `--protect-health-metrics` (load balancers
and Prometheus usually call those without credentials). A route of another module joins
the guarded ones with `dependencies=[Security(require_api_key)]`.
"""

from __future__ import annotations

import argparse
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar

from fastapi import FastAPI, Request, Security
from fastapi.middleware.cors import CORSMiddleware
from fastapi.params import Security as SecurityParam
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from api.errors import APIError

API_KEY_ENV = "NANO_VLLM_API_KEY"
# Sent by our clients, and read back by them across origins.
CORS_REQUEST_HEADERS = ["Authorization", "Content-Type", "X-Request-Id", "X-Api-Key",
                        "Anthropic-Version", "Anthropic-Beta"]
CORS_EXPOSED_HEADERS = ["X-Request-Id", "Retry-After", "Server-Timing"]

# Declare the schemes (either will do) in the OpenAPI document; the check itself is
# require_api_key's.
bearer_scheme = HTTPBearer(auto_error=False, scheme_name="APIKey",
                           description="One of the server's --api-key keys.")
api_key_header_scheme = APIKeyHeader(name="x-api-key", auto_error=False,
                                     scheme_name="XAPIKey",
                                     description="The same keys, as Anthropic's clients send "
                                                 "them.")


@dataclass(frozen=True)
class AccessConfig:
    api_keys: tuple[str, ...] = ()  # none: no key needed
    protect_health_metrics: bool = False  # /health and /metrics need a key too
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed by CORS; "*" for any

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--api-key", action="append", default=[], metavar="KEY",
                            help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY'); "
                                 "repeat for several keys (also from "
                                 f"${API_KEY_ENV}, comma-separated)")
        parser.add_argument("--protect-health-metrics", action="store_true",
                            help="with --api-key, /health and /metrics need a key too "
                                 "(default: they stay open)")
        parser.add_argument("--allowed-origins", nargs="+", action="extend", default=[],
                            metavar="ORIGIN",
                            help="browser origins allowed to call the API (CORS), e.g. "
                                 "https://app.example.com, or '*' for any (default: none)")

    @classmethod
    def from_args(cls, args: argparse.Namespace,
                  environ: Mapping[str, str] = os.environ) -> AccessConfig:
        from_env = [k.strip() for k in environ.get(API_KEY_ENV, "").split(",") if k.strip()]
        keys = [*args.api_key, *from_env]
        if any(not key.strip() for key in keys):
            raise ValueError("--api-key must not be empty")
        if args.protect_health_metrics and not keys:
            raise ValueError(f"--protect-health-metrics needs --api-key or ${API_KEY_ENV}")
        return cls(tuple(dict.fromkeys(keys)), args.protect_health_metrics,
                   tuple(args.allowed_origins))


class APIKeyCheck:
    """Compares a bearer token with every key in constant time (hmac.compare_digest), so
    neither which key matched nor how much of one did shows in the timing."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def allows(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries a key (as a bearer token)."""
        if not self._keys:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return self.allows_key(token)

    def allows_key(self, key: str) -> bool:
        """Whether `key` (from an x-api-key header or a query) is one of the keys."""
        if not self._keys:
            return True
        given = key.strip().encode()
        matches = [hmac.compare_digest(given, k) for k in self._keys]  # no early exit
        return any(matches)


class AuthenticationError(APIError):
    headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": "Bearer"}  # RFC 9110

    def __init__(self, message: str) -> None:
        super().__init__(message, status=401, code="invalid_api_key")


async def require_api_key(
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
        __: Annotated[str | None, Security(api_key_header_scheme)] = None) -> None:
    """The guard of every protected route: 401 (in the route's error shape) without a valid
    key in Authorization or x-api-key."""
    check: APIKeyCheck = request.app.state.api_key_check
    authorization = request.headers.get("authorization")
    api_key = request.headers.get("x-api-key")
    if authorization is not None and check.allows(authorization):
        return
    if api_key is not None and check.allows_key(api_key):
        return
    if not check.enabled:
        return
    if authorization is None and api_key is None:
        raise AuthenticationError("No API key provided: send 'Authorization: Bearer KEY' "
                                  "or 'x-api-key: KEY'.")
    raise AuthenticationError("Incorrect API key provided.")


async def require_api_key_or_query(request: Request) -> None:
    """The guard of pages a browser opens (the dashboard): a browser sends no Authorization
    header when it loads a page or opens an EventSource, so the key may also come as
    `?api_key=KEY` (it then shows in the URL: use it only over a trusted connection)."""
    key = request.query_params.get("api_key")
    if key is not None and request.app.state.api_key_check.allows_key(key):
        return
    await require_api_key(request, None, None)


def guard(app: FastAPI, guarded: bool = True, browser: bool = False) -> list[SecurityParam]:
    """Dependencies for a route: the key check when keys are set and the route is guarded
    (`browser`: the header or an `api_key` query parameter). Left off entirely otherwise,
    so the OpenAPI document asks for a key only where one is needed."""
    if not (guarded and app.state.api_key_check.enabled):
        return []
    return [Security(require_api_key_or_query if browser else require_api_key)]


def install_access(app: FastAPI, access: AccessConfig) -> None:
    """Keep the keys where require_api_key finds them, and answer CORS for the origins."""
    app.state.api_key_check = APIKeyCheck(access.api_keys)
    add_cors(app, access.allowed_origins)


def add_cors(app: FastAPI, origins: tuple[str, ...]) -> None:
    """Answer CORS (preflights, and the headers on every response) for `origins`, if any."""
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(origins),
                           allow_methods=["GET", "POST"], allow_headers=CORS_REQUEST_HEADERS,
                           expose_headers=CORS_EXPOSED_HEADERS)
