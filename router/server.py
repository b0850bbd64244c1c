"""uvicorn, configured for the router: no per-request access log, and a shutdown that drains
in-flight requests, then ends the rest with a clear error instead of cutting connections."""

from __future__ import annotations

import logging
import socket

import uvicorn

from router.api_keys import KeyState
from router.app import make_app
from router.middleware.drain_gate import DrainState
from router.config import RouterConfig
from router.children.pool import WorkerPool
from router.reload import Reloader
from router.middleware.startup_gate import StartupState

logger = logging.getLogger(__name__)

# margin after the drain deadline for the error events to reach clients before uvicorn
# cancels whatever is still running
_CANCEL_MARGIN_S = 2.0


class RouterServer(uvicorn.Server):
    """A uvicorn server that owns the pool's shutdown order.

    uvicorn's own graceful shutdown stops accepting, waits for open connections, then
    cancels them mid-write. Here the listener stays open while in-flight requests get
    `shutdown_drain_s` to finish, and new ones are answered 503 with `Retry-After`;
    whatever is still running then fails with "the server is shutting down" (an SSE error
    event or a 503), so every client gets a well-formed answer. Then uvicorn closes the
    listener and the connections, and the lifespan stops the workers.
    """

    def __init__(self, config: uvicorn.Config, pool: WorkerPool, drain_s: float, drain: DrainState) -> None:
        super().__init__(config)
        self.pool = pool
        self.drain_s = drain_s
        self.drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.draining = True
        logger.info("shutting down: new requests get 503; in-flight ones have %.0f s to finish", self.drain_s)
        try:
            await self.pool.drain(self.drain_s)
        finally:
            await super().shutdown(sockets)


def make_server(config: RouterConfig, pool: WorkerPool, keys: KeyState | None = None,
                reloader: Reloader | None = None, startup: StartupState | None = None) -> RouterServer:
    """The HTTP server for `pool`; call `serve(sockets=[...])` on it. See `make_app` for
    `keys`, `reloader` and `startup`."""
    drain = DrainState()
    return RouterServer(uvicorn.Config(
        make_app(config, pool, drain, keys, reloader, startup),
        host=config.host,
        port=config.port,
        log_config=None,  # the process's logging config covers uvicorn's loggers too
        log_level=config.log_level,
        access_log=config.log_level == "debug",  # one line per request is noise at info
        lifespan="on",
        timeout_graceful_shutdown=config.shutdown_drain_s + _CANCEL_MARGIN_S,
        server_header=False,
    ), pool, config.shutdown_drain_s, drain)
