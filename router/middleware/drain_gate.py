"""While the service shuts down (SIGTERM from launchd or systemd), new requests get a 503
with `Retry-After` in their route's error shape; requests already running are left to
finish. The listener stays open meanwhile, so a client is told to come back rather than
refused a connection (which some SDKs do not retry)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from router.http_errors import error_response_for

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
        response = error_response_for(scope, 503, "shutting_down", MESSAGE)
        await response(scope, receive, send)
