"""While the service starts (the port opens before the pinned and command-line models
are loaded), `/health` says `starting` and API requests are held until the pool takes
requests (its kvstore is up): from there they wait for their model like any request
(`router.children.model_waits`), with their route's keep-alives, rather than being refused. An agent
launched at login with the service gets its answer, a bit later. Probes and `/admin/*`
pass at once, so people and scripts can watch the load.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from router.middleware.auth import is_admin_path
from router.http_errors import error_response_for

OPEN_PATHS = frozenset({"/health", "/api/hello"})


@dataclass
class StartupState:
    """Set once: `ready` when the start finished, with `error` when it failed; `accepting`
    (the pool's) once requests can go on to wait for their models."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None
    timeout_s: float = 600.0  # longest a request is held before the pool takes requests
    accepting: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def starting(self) -> bool:
        return not self.ready.is_set()

    def finish(self, error: str | None = None) -> None:
        self.error = error
        self.ready.set()

    async def wait_accepting(self) -> None:
        """Until requests can pass: the pool takes them, or the start ended."""
        waiters = {asyncio.ensure_future(self.accepting.wait()), asyncio.ensure_future(self.ready.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


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
            await asyncio.wait_for(self.state.wait_accepting(), self.state.timeout_s)
        except TimeoutError:
            pass
        if self.state.error is None and (self.state.accepting.is_set() or self.state.ready.is_set()):
            await self.app(scope, receive, send)
            return
        message = (f"the service failed to start: {self.state.error}" if self.state.error is not None
                   else "the service is still starting; retry shortly")
        response = error_response_for(scope, 503, "starting", message)  # with Retry-After
        await response(scope, receive, send)
