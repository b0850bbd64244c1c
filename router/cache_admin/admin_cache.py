"""Routes for the prefix cache of every model (`mlxd cache stats|clear`): `GET /admin/cache`
and `POST /admin/cache/clear`. A clear goes through the processes that own the blocks (each
worker drops its hot tier, the kvstore its blocks), never through files under a running
service. The shapes are documented in the README ("Routes"); keep the two in step."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import RequestError, WorkerDead
from protocol.messages import CacheCleared, ClearCache
from router.json_body import parse_json_body
from router.children.pool import WorkerPool
from router.requests import ask

logger = logging.getLogger(__name__)

# A worker answers between two engine steps, so a long prefill step delays the answer.
WORKER_CLEAR_TIMEOUT_S = 30.0
# The kvstore clears in order with the writes queued before it, so a backlog delays it.
KVSTORE_CLEAR_TIMEOUT_S = 30.0


def _hit_rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 3) if hits + misses else None


def _hot_tier(pool: WorkerPool, model_id: str) -> dict[str, Any] | None:
    """The worker's hot tier as its last pong said (the figures /admin/status shows, at
    most heartbeat_s old); None when no worker of the model is ready."""
    supervisor = pool.waits.ready_now(model_id)
    if supervisor is None:
        return None
    stats = (supervisor.last_pong.stats if supervisor.last_pong else {}) or {}
    hits, misses = stats.get("hits", 0), stats.get("misses", 0)
    return {
        "blocks": stats.get("hot_blocks", 0),
        "bytes": stats.get("hot_bytes", 0),
        "budget_bytes": supervisor.ready.hot_tier_bytes if supervisor.ready else 0,
        "pinned_blocks": stats.get("hot_pinned_blocks", 0),  # of the blocks, those snapshots or breakpoints pin
        "pinned_bytes": stats.get("hot_pinned_bytes", 0),
        # of the pinned bytes, those clients' cache_control breakpoints hold (for their TTL)
        "breakpoint_pinned_bytes": stats.get("breakpoint_pinned_bytes", 0),
        "breakpoint_prefixes": stats.get("breakpoint_prefixes", 0),
        "hits": hits,
        "misses": misses,
        "hit_rate": _hit_rate(hits, misses),
    }


def _cold_namespace(namespace: dict[str, Any] | None) -> dict[str, Any]:
    """A model's share of the cold tier: workers store under their model id."""
    namespace = namespace or {}
    hits, misses = namespace.get("hits", 0), namespace.get("misses", 0)
    return {"blocks": namespace.get("blocks", 0), "bytes": namespace.get("bytes", 0),
            "pinned_blocks": namespace.get("pinned_blocks", 0), "pinned_bytes": namespace.get("pinned_bytes", 0),
            "hits": hits, "misses": misses, "hit_rate": _hit_rate(hits, misses)}


async def cache_stats(request: Request) -> Response:
    """GET /admin/cache[?model=NAME]: per model its hot tier (loaded workers) and its share
    of the cold tier, and the cold tier as a whole (models no longer served included)."""
    pool: WorkerPool = request.app.state.pool
    name = request.query_params.get("model")
    selected = pool.models if name is None else [pool.resolve(name)[0]]
    stats = await pool.kvstore_stats() if pool.kvstore is not None else None
    namespaces = (stats or {}).get("namespaces") or {}
    models = [{
        "id": model_id,
        "state": pool.state_of(model_id),
        "hot_tier": _hot_tier(pool, model_id),
        "cold_tier": _cold_namespace(namespaces.get(model_id)) if stats is not None else None,
    } for model_id in selected]
    cold: dict[str, Any] | None = None
    if pool.kvstore is not None:
        stats = stats or {}  # a kvstore that does not answer: its state, and no figures
        hits, misses = stats.get("hits"), stats.get("misses")
        cold = {
            "state": pool.kvstore.state,
            "blocks": stats.get("num_blocks"),
            "bytes": stats.get("disk_bytes"),
            "max_bytes": stats.get("max_disk_bytes"),
            "pinned_blocks": stats.get("pinned_blocks"),
            "pinned_bytes": stats.get("pinned_bytes"),
            "snapshots": stats.get("num_snapshots"),
            "hits": hits,
            "misses": misses,
            "hit_rate": _hit_rate(hits, misses) if hits is not None and misses is not None else None,
        }
    return JSONResponse({"models": models, "cold_tier": cold})


async def _requested_model(request: Request, pool: WorkerPool) -> str | None:
    """The model id of an optional `{"model": NAME}` body (a name, profile or alias; an
    unknown one is a 404 in the routes' error shape); None: every model."""
    raw = await request.body()
    body = parse_json_body(raw) if raw.strip() else {}
    name = body.get("model")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise RequestError("'model' must be a model name (or be left out to clear every model)", param="model")
    model_id, _ = pool.resolve(name)
    return model_id


async def _clear_hot(request: Request, model_id: str) -> tuple[dict[str, Any], str | None]:
    """Ask `model_id`'s worker, if it is loaded, to drop its hot tier: (its entry in the
    answer, a note or None)."""
    unloaded = {"id": model_id, "loaded": False, "hot_tier": None}
    try:
        answer = await ask(request, model_id, ClearCache(f"cache-clear-{uuid.uuid4().hex[:12]}"), CacheCleared,
                           load=False, timeout_s=WORKER_CLEAR_TIMEOUT_S)
    except WorkerDead as exc:  # its hot tier went with it
        return unloaded, f"the worker of '{model_id}' went away ({exc})"
    if answer is None:
        return unloaded, None
    hot = {"blocks": answer.num_blocks, "bytes": answer.num_bytes, "dropped_writes": answer.num_dropped_writes}
    return {"id": model_id, "loaded": True, "hot_tier": hot}, None


async def clear_cache(request: Request) -> Response:
    """POST /admin/cache/clear with an optional `{"model": NAME}`: drop that model's hot
    tier and its kvstore namespace, or every hot tier and the whole kvstore. Hot tiers go
    first: a worker also drops its writes still queued for the SSD, which would otherwise
    land after the kvstore's clear. Running requests finish unchanged (their blocks stay
    theirs) and store their new blocks as usual."""
    pool: WorkerPool = request.app.state.pool
    model_id = await _requested_model(request, pool)
    targets = pool.models if model_id is None else [model_id]
    cleared = await asyncio.gather(*(_clear_hot(request, m) for m in targets))
    notes = [note for _, note in cleared if note]
    if model_id is not None and not cleared[0][0]["loaded"] and not notes:
        notes.append(f"model '{model_id}' is not loaded ({pool.state_of(model_id)}): it has no hot tier; "
                     + ("only its cold tier was cleared" if pool.kvstore is not None else "nothing was cleared"))
    num_hot = sum((entry["hot_tier"] or {}).get("blocks", 0) for entry, _ in cleared)
    cold: dict[str, Any] | None = None
    if pool.kvstore is not None:
        num_removed = await pool.kvstore.clear(model_id, timeout_s=KVSTORE_CLEAR_TIMEOUT_S)
        if num_removed is None:
            raise RequestError(f"the kvstore ({pool.kvstore.state}) did not answer within "
                               f"{KVSTORE_CLEAR_TIMEOUT_S:.0f} s: its blocks were not cleared (the hot tiers "
                               f"were: {num_hot} blocks); retry", status=503, error_type="server_error",
                               code="kvstore_unavailable")
        cold = {"namespace": model_id, "blocks": num_removed}
        snapshots = await pool.kvstore.snapshots(model_id)
        if snapshots:
            notes.append(f"{len(snapshots)} snapshot(s) keep their pinned blocks in both tiers "
                         f"({', '.join(s['name'] for s in snapshots)}): DELETE /admin/cache/snapshots/NAME "
                         "lets them go")
    else:
        notes.append("the cold tier is off (--no-cold-tier)")
    logger.info("cache cleared (%s): %d hot blocks, %s cold blocks", model_id or "every model", num_hot,
                cold["blocks"] if cold else "no")
    return JSONResponse({"model": model_id, "models": [entry for entry, _ in cleared], "cold_tier": cold,
                         "notes": notes})
