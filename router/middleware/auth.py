"""API-key check in front of every route but the probes (/health, Claude Code's /api/hello),
which must work without the key, and the dashboard's static files (`GET /admin` and its
assets: no data, the page asks for the key and sends it with every call it makes).

`/metrics` follows the admin routes' rule: it tells what `/admin/status` tells (models,
memory, traffic), so with keys configured it needs a key that may administer (the admin
key, or any key when no admin key is set); a scraper sends it as `Authorization: Bearer`."""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.api_keys import KeyState
from router.http_errors import error_response_for

# Claude Code sends `HEAD /api/hello` with no key at start-up, as a connectivity check
OPEN_PATHS = frozenset({"/health", "/api/hello"})

logger = logging.getLogger(__name__)


def supplied_key(headers: Headers) -> str | None:
    """The key from `Authorization: Bearer KEY`, or `x-api-key` (what Anthropic clients send)."""
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key")


ADMIN_PREFIX = "/admin"
METRICS_PATH = "/metrics"
DASHBOARD_PAGES = frozenset({ADMIN_PREFIX, ADMIN_PREFIX + "/"})  # GET /admin: the dashboard's HTML
DASHBOARD_ASSETS = ADMIN_PREFIX + "/dashboard/"  # its script and style sheet


def is_admin_path(path: str) -> bool:
    """The routes that need a key that may administer: /admin/* and /metrics."""
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/") or path == METRICS_PATH


def is_open_path(path: str) -> bool:
    """Answered without a key: the probes, and the dashboard's static files."""
    return (path in OPEN_PATHS or path in DASHBOARD_PAGES
            or (path.startswith(DASHBOARD_ASSETS) and ".." not in path and "\\" not in path))


class APIKeyMiddleware:
    """Answers 401 in the route's error shape unless the request carries a configured key,
    and 403 on `/admin/*` for a key that may not administer. The key's name goes into the
    request's scope state (`api_key_name`), for the request's log line.

    A pure ASGI middleware (not BaseHTTPMiddleware), so streamed responses and client
    disconnects pass through untouched. With no key configured it is a no-op. It reads
    `keys.ring` per request, so a reload's new keys apply to the next request.
    """

    def __init__(self, app: ASGIApp, keys: KeyState) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ring = self.keys.ring
        if not ring.required or scope["type"] != "http" or is_open_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        supplied = supplied_key(headers)
        key = ring.match(supplied)
        if key is not None and (not is_admin_path(scope["path"]) or ring.may_administer(key)):
            self.keys.record(key)
            scope.setdefault("state", {})["api_key_name"] = key.name
            await self.app(scope, receive, send)
            return
        if key is not None:  # a valid key, but not the admin key
            logger.info("refused %s %s to key %r: admin routes need the admin key",
                        scope["method"], scope["path"], key.name)
            message = f"the key {key.name!r} may not use {ADMIN_PREFIX}/* or {METRICS_PATH}: send the admin key"
            response = error_response_for(scope, 403, "insufficient_permissions", message)
            await response(scope, receive, send)
            return
        if supplied is None:
            message = "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
        else:
            message = "incorrect API key provided"
        response = error_response_for(scope, 401, "invalid_api_key", message)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
