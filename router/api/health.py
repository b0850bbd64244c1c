"""GET /health: whether every worker (and the kvstore) is up, for probes and people; and
GET/HEAD /api/hello, the probe Claude Code sends at start-up."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from router.children.pool import WorkerPool
from router.middleware.web_guard import holds_key, states_only


async def health(request: Request) -> Response:
    """200 when every worker is ready, else 503 with the same body (status "degraded";
    "starting" until the start has loaded the pinned and command-line models; "draining"
    once SIGTERM came).

    Open to probes without the API key, but then only states: pids, paths and error text
    tell an outsider about the machine and are for whoever holds the key."""
    pool: WorkerPool = request.app.state.pool
    body = pool.health()
    starting = request.app.state.startup.starting
    draining = request.app.state.drain.draining
    if starting:  # the port is open while the pinned and command-line models load
        body["status"] = "starting"
    elif draining:  # a load balancer sends no new requests here; running ones finish
        body["status"] = "draining"
    if not holds_key(request.headers, request.app.state.keys.ring):
        body = states_only(body)
    return JSONResponse(body, status_code=200 if pool.is_healthy() and not (starting or draining) else 503)


async def hello(request: Request) -> Response:
    """GET/HEAD /api/hello: Claude Code's connectivity probe at start-up (no key, no body
    read). It only asks whether something answers here, so it does not wait for a model."""
    return Response(status_code=200)
