"""While the service starts (the port opens before the pinned and command-line models
are loaded), `/health` says `starting` and API requests wait for the start to finish
rather than being refused: an agent launched at login with the service gets its answer,
a bit later. Probes and `/admin/*` pass at once, so people and scripts can watch the load.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.api import anthropic_errors
from router.auth import is_admin_path, is_anthropic
from router.http_errors import error_response

OPEN_PATHS = frozenset({"/health", "/api/hello"})


@dataclass
class StartupState:
    """Set once: `ready` when the start finished, with `error` when it failed."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None
    timeout_s: float = 600.0  # longest a request waits for the start

    @property
    def starting(self) -> bool:
        return not self.ready.is_set()

    def finish(self, error: str | None = None) -> None:
        self.error = error
        self.ready.set()


class StartupGateMiddleware:
    def __init__(self, app: ASGIApp, state: StartupState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or not self.state.starting or scope["path"] in OPEN_PATHS
                or is_admin_path(scope["path"])):
            await self.app(scope, receive, send)
            return
        try:
            await asyncio.wait_for(self.state.ready.wait(), self.state.timeout_s)
        except TimeoutError:
            pass
        if self.state.ready.is_set() and self.state.error is None:
            await self.app(scope, receive, send)
            return
        message = (f"the service failed to start: {self.state.error}" if self.state.error is not None
                   else "the service is still starting; retry shortly")
        if is_anthropic(scope, Headers(scope=scope)):
            response = anthropic_errors.error_response(503, "api_error", message)
        else:
            response = error_response(503, message, "server_error", None, "starting")  # with Retry-After
        await response(scope, receive, send)
