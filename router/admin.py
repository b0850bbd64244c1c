"""Routes for operators and their scripts: the JSON status, load / unload / pin / unpin /
restart of one model, and reloading the configuration. The status schema is documented in the README and
checked by a test; keep the three in step."""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

import psutil
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import RequestError
from protocol.settings import layout_in_effect
from router import old_names
from router.children.pool import WorkerPool
from router.reload import Reloader, ReloadRefused
from router.children.worker_client import RequestStream


def _pool(request: Request) -> WorkerPool:
    return request.app.state.pool


def service_version() -> str:
    try:
        return importlib.metadata.version("mlxd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _rate(values: list[float]) -> float | None:
    values = [v for v in values if v > 0]
    return round(sum(values) / len(values), 2) if values else None


def _breakpoints(worker_stats: dict[str, Any]) -> dict[str, Any]:
    return {"prefixes": worker_stats.get("breakpoint_prefixes", 0),
            "pinned_blocks": worker_stats.get("breakpoint_pinned_blocks", 0),
            "pinned_bytes": worker_stats.get("breakpoint_pinned_bytes", 0),
            "limit_bytes": worker_stats.get("breakpoint_pin_limit_bytes", 0),
            "lapsed": worker_stats.get("breakpoint_lapsed", 0),
            "expired": worker_stats.get("breakpoint_expired", 0)}


def _model_status(pool: WorkerPool, model_id: str, now: float) -> dict[str, Any]:
    entry = pool.registry[model_id]
    supervisor = pool.supervisors.get(model_id)
    pid = supervisor.pid if supervisor else None
    worker_stats = (supervisor.last_pong.stats if supervisor and supervisor.last_pong else {}) or {}
    ttl = pool.ttl_s(model_id)
    last_used = pool.last_used.get(model_id)
    recent = pool.recent.get(model_id, [])
    hits, misses = worker_stats.get("hits", 0), worker_stats.get("misses", 0)
    loaded = supervisor is not None
    hot_tier = {
        "bytes": worker_stats.get("hot_bytes", 0),
        "budget_bytes": supervisor.ready.hot_tier_bytes if supervisor and supervisor.ready else 0,
        "blocks": worker_stats.get("hot_blocks", 0),
        "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
        # what clients' cache_control breakpoints keep pinned (at most breakpoint_pin_share of the budget)
        "breakpoints": _breakpoints(worker_stats),
    }
    return old_names.with_old_keys({
        "id": model_id,
        "kind": entry.kind,
        "state": pool.state_of(model_id),
        "pinned": model_id in pool.pinned,
        "ttl_s": ttl or None,
        "ttl_left_s": (round(max(0.0, ttl - (now - last_used)), 1)
                       if ttl and loaded and last_used and model_id not in pool.pinned else None),
        "last_used": last_used,
        "pid": pid,
        "rss_bytes": supervisor.rss_bytes() if supervisor else 0,
        "estimated_bytes": pool.memory.need_bytes(entry),
        "requests_in_flight": pool.in_flight(model_id),
        "restarts": supervisor.num_restarts if supervisor else 0,
        "recent_prompt_tok_s": _rate([e.timings.prompt_tokens_per_s for e in recent]),
        "recent_decode_tok_s": _rate([e.timings.decode_tokens_per_s for e in recent]),
        # the worker's MLX arrays: live, freed but kept for reuse (capped by mlx_cache_mb), peak
        "mlx_memory": {key: worker_stats.get(f"mlx_{key}_bytes", 0) for key in ("active", "cache", "peak")},
        "hot_tier": hot_tier,
        # how chat prompts with tools are laid out (README: Prompt layout); None until loaded
        "prompt_layout": (layout_in_effect(pool.config.worker.prompt_layout, supervisor.ready.tools_first)
                          if supervisor and supervisor.ready and supervisor.ready.kind == "chat" else None),
    }, old_names.STATUS_MODEL)


async def _kvstore_status(pool: WorkerPool) -> dict[str, Any] | None:
    if pool.kvstore is None:
        return None
    stats = await pool.kvstore_stats() or {}
    pongs = [s.last_pong.stats for s in pool.supervisors.values() if s.last_pong is not None]
    hits, misses = stats.get("hits", 0), stats.get("misses", 0)
    return {
        **pool.kvstore.health(),
        "bytes": stats.get("disk_bytes"),
        "max_bytes": stats.get("max_disk_bytes"),
        "blocks": stats.get("num_blocks"),
        "segments": stats.get("num_segments"),
        "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
        "write_queue_depth": sum(p.get("cold_write_queue", 0) for p in pongs),
        "dropped_writes": stats.get("dropped", 0) + sum(p.get("cold_dropped_blocks", 0) for p in pongs),
        "evictions": stats.get("evictions"),
        "namespaces": stats.get("namespaces", {}),
    }


def _request_status(stream: RequestStream, now: float) -> dict[str, Any]:
    """One request in flight, as the dashboard's live list shows it."""
    tok_s = stream.tokens_per_s()
    return old_names.with_old_keys({
        "id": stream.request_id,
        "model": stream.model,
        "route": stream.route or None,  # None: the router's own question (a token count, a cache clear)
        "user_agent": stream.user_agent,
        "state": stream.phase,
        "prompt_tokens": stream.prompt_tokens,
        "cached_tokens": stream.cached_tokens,
        "generated_tokens": stream.num_tokens,
        "tok_s": round(tok_s, 1) if tok_s is not None else None,
        "age_s": round(now - stream.created, 2),
    }, old_names.STATUS_REQUEST)


async def status(request: Request) -> Response:
    """GET /admin/status: everything an ops script needs, in one JSON object."""
    pool = _pool(request)
    now = time.time()
    memory = psutil.virtual_memory()
    models = [_model_status(pool, m, now) for m in pool.models]
    body = {
        "version": service_version(),
        "uptime_s": round(now - pool.started_at, 1),
        "memory": {
            "total_bytes": memory.total,
            "available_bytes": memory.available,
            "budget_bytes": pool.memory.budget_bytes,
            "used_bytes": pool.used_bytes(),
            "workers": {m["id"]: m["rss_bytes"] for m in models if m["pid"] is not None},
        },
        "starting": request.app.state.startup.starting,
        "config_file": str(pool.config.config) if pool.config.config is not None else None,
        "keys": request.app.state.keys.status(),
        "models": models,
        "kvstore": await _kvstore_status(pool),
        "requests": [_request_status(s, now) for s in (pool.client.open_requests() if pool.client else [])],
        # what the router counted since it started, and the last minutes of it (the dashboard's charts)
        "totals": pool.metrics.totals.as_json(),
        "history": pool.metrics.history.as_json(),
    }
    return JSONResponse(body)


async def load_model(request: Request) -> Response:
    pool = _pool(request)
    model_id, _ = pool.resolve(request.path_params["model_id"])
    started = time.monotonic()
    await pool.load(model_id)
    pool.last_used[model_id] = time.time()
    return JSONResponse({"model": model_id, "state": pool.state_of(model_id),
                         "load_s": round(time.monotonic() - started, 3)})


async def unload_model(request: Request) -> Response:
    pool = _pool(request)
    model_id, _ = pool.resolve(request.path_params["model_id"])
    await pool.unload(model_id)
    return JSONResponse({"model": model_id, "state": pool.state_of(model_id)})


async def pin_model(request: Request) -> Response:
    pool = _pool(request)
    model_id, _ = pool.resolve(request.path_params["model_id"])
    pool.names.pin(model_id)
    return JSONResponse({"model": model_id, "pinned": True})


async def unpin_model(request: Request) -> Response:
    pool = _pool(request)
    model_id, _ = pool.resolve(request.path_params["model_id"])
    pool.names.unpin(model_id)
    return JSONResponse({"model": model_id, "pinned": False})


async def restart_worker(request: Request) -> Response:
    """Restart one model's worker: in-flight requests drain, pending SSD writes are
    flushed, and the new worker restores prefixes from the cold tier. Answers when the
    new worker is ready."""
    pool = _pool(request)
    supervisor = pool.get(request.path_params["model_id"])
    old_pid = supervisor.pid
    started = time.monotonic()
    await supervisor.restart()
    return JSONResponse({
        "model": supervisor.model_id,
        "old_pid": old_pid,
        "pid": supervisor.pid,
        "state": supervisor.state,
        "restart_s": round(time.monotonic() - started, 3),
    })


async def reload_config(request: Request) -> Response:
    """POST /admin/reload: what SIGHUP does, answered with what changed. A wrong file is
    a 400 with the reason, and the running configuration stays."""
    reloader: Reloader | None = request.app.state.reloader
    if reloader is None:
        raise RequestError("this service was not started by `mlxd serve`; there is no configuration to reload",
                           status=409, code="reload_unavailable")
    try:
        report = await reloader.reload()
    except ReloadRefused as exc:
        raise RequestError(f"configuration refused, the running one stays: {exc}", code="invalid_config") from None
    return JSONResponse({"reloaded": True, **report.as_json()})
