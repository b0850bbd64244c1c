"""API-key check in front of every route but /health (probes must work without the key)."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.http_errors import error_response

OPEN_PATHS = frozenset({"/health"})


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
        key = supplied_key(Headers(scope=scope))
        if key is not None and hmac.compare_digest(key.encode(), self.api_key.encode()):
            await self.app(scope, receive, send)
            return
        message = ("missing API key: send 'Authorization: Bearer KEY'" if key is None
                   else "incorrect API key provided")
        response = error_response(401, message, "invalid_request_error", None, "invalid_api_key")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
