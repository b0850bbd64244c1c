"""GET /v1/models and /v1/models/{id}: every model the pool can serve, and every profile."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from router.api.openai_format import model_card
from router.pool import WorkerPool


def _card(pool: WorkerPool, name: str) -> dict[str, Any]:
    model_id, profile = pool.resolve(name)
    supervisor = pool.supervisors.get(model_id)
    extra: dict[str, Any] = {"kind": pool.registry[model_id].kind, "state": pool.state_of(model_id),
                             "pinned": model_id in pool.pinned}
    if profile is not None:
        extra["profile_of"] = model_id
    if supervisor is not None and supervisor.ready is not None:
        extra["context_length"] = supervisor.ready.context_length
    return model_card(name, pool.created, **extra)


async def list_models(request: Request) -> Response:
    pool: WorkerPool = request.app.state.pool
    profiles = sorted(pool.config.profiles)
    names = [*pool.models, *(p for p in profiles if p not in pool.registry)]
    return JSONResponse({"object": "list", "data": [_card(pool, m) for m in names]})


async def get_model(request: Request) -> Response:
    return JSONResponse(_card(request.app.state.pool, request.path_params["model_id"]))
