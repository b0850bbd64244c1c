"""API-key check in front of every route but the probes (/health, Claude Code's /api/hello),
which must work without the key."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.api import anthropic_errors
from router.http_errors import error_response

# Claude Code sends `HEAD /api/hello` with no key at start-up, as a connectivity check
OPEN_PATHS = frozenset({"/health", "/api/hello"})
ANTHROPIC_PATH = "/v1/messages"  # and everything under it: count_tokens


def is_anthropic(scope: Scope, headers: Headers) -> bool:
    """A request from an Anthropic client, which expects Anthropic's error shape: one on an
    Anthropic route, or one carrying the `anthropic-version` header its SDKs always send."""
    path = scope["path"]
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/") or "anthropic-version" in headers


def supplied_key(headers: Headers) -> str | None:
    """The key from `Authorization: Bearer KEY`, or `x-api-key` (what Anthropic clients send)."""
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key")


class APIKeyMiddleware:
    """Answers 401 in OpenAI's error shape unless the request carries the configured key.

    A pure ASGI middleware (not BaseHTTPMiddleware), so streamed responses and client
    disconnects pass through untouched. With no key configured it is a no-op.
    """

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        key = supplied_key(headers)
        if key is not None and hmac.compare_digest(key.encode(), self.api_key.encode()):
            await self.app(scope, receive, send)
            return
        if is_anthropic(scope, headers):
            message = ("missing API key: send 'x-api-key: KEY' or 'Authorization: Bearer KEY'" if key is None
                       else "invalid x-api-key")
            response = anthropic_errors.error_response(401, "authentication_error", message)
        else:
            message = ("missing API key: send 'Authorization: Bearer KEY'" if key is None
                       else "incorrect API key provided")
            response = error_response(401, message, "invalid_request_error", None, "invalid_api_key")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
