"""Who may call the server: API keys (`Authorization: Bearer`) and browsers from other
origins (CORS).

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
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import APIError

API_KEY_ENV = "NANO_VLLM_API_KEY"
# Sent by our clients, and read back by them across origins.
CORS_REQUEST_HEADERS = ["Authorization", "Content-Type", "X-Request-Id"]
CORS_EXPOSED_HEADERS = ["X-Request-Id", "Retry-After", "Server-Timing"]

# Declares the scheme in the OpenAPI document; the check itself is require_api_key's.
bearer_scheme = HTTPBearer(auto_error=False, scheme_name="APIKey",
                           description="One of the server's --api-key keys.")


@dataclass(frozen=True)
class AccessConfig:
    api_keys: tuple[str, ...] = ()  # none: no key needed
    protect_health_metrics: bool = False  # /health and /metrics need a key too
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed by CORS; "*" for any

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--api-key", action="append", default=[], metavar="KEY",
                            help="require 'Authorization: Bearer KEY'; repeat for several "
                                 f"keys (also from ${API_KEY_ENV}, comma-separated)")
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
        if not self._keys:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = token.strip().encode()
        matches = [hmac.compare_digest(given, key) for key in self._keys]  # no early exit
        return any(matches)


class AuthenticationError(APIError):
    headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": "Bearer"}  # RFC 9110

    def __init__(self, message: str) -> None:
        super().__init__(message, status=401, code="invalid_api_key")


async def require_api_key(
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]) -> None:
    """The guard of every protected route: 401 in OpenAI's envelope without a valid key."""
    check: APIKeyCheck = request.app.state.api_key_check
    authorization = request.headers.get("authorization")
    if check.allows(authorization):
        return
    if not authorization:
        raise AuthenticationError("No API key provided: send 'Authorization: Bearer KEY'.")
    raise AuthenticationError("Incorrect API key provided.")


def guard(app: FastAPI, guarded: bool = True) -> list[SecurityParam]:
    """Dependencies for a route: the key check when keys are set and the route is guarded.
    (Left off entirely otherwise, so the OpenAPI document asks for a key only where one
    is needed.)"""
    return [Security(require_api_key)] if guarded and app.state.api_key_check.enabled else []


def install_access(app: FastAPI, access: AccessConfig) -> None:
    """Keep the keys where require_api_key finds them, and answer CORS for the origins."""
    app.state.api_key_check = APIKeyCheck(access.api_keys)
    if access.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(access.allowed_origins),
                           allow_methods=["GET", "POST"], allow_headers=CORS_REQUEST_HEADERS,
                           expose_headers=CORS_EXPOSED_HEADERS)
