"""The Starlette application: routes, error handlers, the web guard and API-key check, and
a lifespan that starts and stops the worker pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from router import admin, dashboard, metrics_route, openapi
from router.cache_admin import admin_cache, cache_probe, cache_snapshots
from router.api import health, models
from router.api.registry import DIALECTS
from router.api_keys import KeyState, key_ring
from router.call_memory import CallMemory
from router.middleware.auth import APIKeyMiddleware
from router.middleware.body_limit import BodyLimitMiddleware
from router.middleware.drain_gate import DrainGateMiddleware, DrainState
from router.reload import Reloader
from router.middleware.request_id import RequestIdMiddleware
from router.middleware.send_timeout import SendTimeoutMiddleware
from router.middleware.startup_gate import StartupGateMiddleware, StartupState
from router.config import RouterConfig
from router.http_errors import EXCEPTION_HANDLERS
from router.children.pool import WorkerPool
from router.middleware.web_guard import web_middleware


def make_app(config: RouterConfig, pool: WorkerPool, drain: DrainState | None = None,
             keys: KeyState | None = None, reloader: Reloader | None = None,
             startup: StartupState | None = None) -> Starlette:
    """The HTTP app in front of `pool`.

    With `startup` the caller starts the pool while the port is already open (the CLI:
    `/health` says `starting`, requests wait) and finishes `startup`; without it the
    lifespan starts the pool. The lifespan always stops it. `drain` turns new requests
    away while the server shuts down; `keys` (default: read from `config` now) and the
    app's `state.config` are what `reloader` swaps.
    """
    keys = keys if keys is not None else KeyState(key_ring(config))
    drain = drain if drain is not None else DrainState()
    managed = startup is None
    if startup is None:
        startup = StartupState()
        startup.finish()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if managed:
            await pool.start()
        try:
            yield
        finally:
            await pool.stop()

    routes = [
        Route("/health", health.health, methods=["GET"]),
        Route("/api/hello", health.hello, methods=["GET"]),  # HEAD too: Starlette adds it to every GET
        Route("/openapi.json", openapi.openapi_json, methods=["GET"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", models.get_model, methods=["GET"]),
        *(Route(e.path, e.handler, methods=[e.method]) for d in DIALECTS for e in d.endpoints),
        Route("/metrics", metrics_route.metrics, methods=["GET"]),
        Route("/admin", dashboard.page, methods=["GET"]),
        Route("/admin/", dashboard.page, methods=["GET"]),
        Mount(dashboard.ASSETS_PATH, StaticFiles(directory=dashboard.ASSETS_DIR), name="dashboard"),
        Route("/admin/status", admin.status, methods=["GET"]),
        Route("/admin/models/{model_id:path}/load", admin.load_model, methods=["POST"]),
        Route("/admin/models/{model_id:path}/unload", admin.unload_model, methods=["POST"]),
        Route("/admin/models/{model_id:path}/pin", admin.pin_model, methods=["POST"]),
        Route("/admin/models/{model_id:path}/unpin", admin.unpin_model, methods=["POST"]),
        Route("/admin/workers/{model_id:path}/restart", admin.restart_worker, methods=["POST"]),
        Route("/admin/cache", admin_cache.cache_stats, methods=["GET"]),
        Route("/admin/cache/clear", admin_cache.clear_cache, methods=["POST"]),
        Route("/admin/cache/probe", cache_probe.probe, methods=["POST"]),
        Route("/admin/cache/snapshots", cache_snapshots.list_snapshots, methods=["GET"]),
        Route("/admin/cache/snapshots", cache_snapshots.create_snapshot, methods=["POST"]),
        Route("/admin/cache/snapshots/{name}", cache_snapshots.delete_snapshot, methods=["DELETE"]),
        Route("/admin/reload", admin.reload_config, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        # outermost first: what a web page may send is settled before the body is read or the key checked
        middleware=[Middleware(SendTimeoutMiddleware, timeout_s=config.stream_send_timeout_s),
                    Middleware(RequestIdMiddleware),
                    Middleware(metrics_route.RequestMetricsMiddleware, pool=pool, routes=routes),
                    *web_middleware(config, keys),
                    Middleware(DrainGateMiddleware, state=drain),
                    Middleware(StartupGateMiddleware, state=startup),
                    Middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes),
                    Middleware(APIKeyMiddleware, keys=keys)],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    metrics_route.watch(pool)
    app.state.config = config
    app.state.pool = pool
    app.state.keys = keys
    app.state.reloader = reloader
    app.state.startup = startup
    app.state.drain = drain
    # what the model generated for each tool call (router.call_memory)
    app.state.call_memory = CallMemory(markup_only=config.generated_calls == "markup") \
        if config.generated_calls != "never" else None
    return app
