"""While the service shuts down (SIGTERM from launchd or systemd), new requests get a 503
with `Retry-After` in their route's error shape; requests already running are left to
finish. The listener stays open meanwhile, so a client is told to come back rather than
refused a connection (which some SDKs do not retry)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.api import anthropic_errors
from router.auth import is_anthropic
from router.http_errors import error_response

MESSAGE = "the server is shutting down; retry shortly"
OPEN_PATHS = ("/health",)  # supervisors still see the process answer while it drains


@dataclass
class DrainState:
    draining: bool = False


class DrainGateMiddleware:
    def __init__(self, app: ASGIApp, state: DrainState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.state.draining or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if is_anthropic(scope, Headers(scope=scope)):
            response = anthropic_errors.error_response(503, "api_error", MESSAGE)
        else:
            response = error_response(503, MESSAGE, "server_error", None, "shutting_down")
        await response(scope, receive, send)
