"""`GET /metrics` (the Prometheus text format), the middleware that counts every answered
request, and the collector of the gauges read at scrape time from the pool: models and
their state, memory, sequences, the cache tiers, and each process's RSS.

Only the router is scraped: what the workers and the kvstore know reaches it over the
protocol it already speaks (pong stats, KVStats), see `router.metrics`. The route follows
the admin routes' key rule (`router.middleware.auth`): with keys configured it needs a key that may
administer, as `/admin/status` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import psutil
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.metrics import HIT_RATE_WINDOW_S
from router.old_names import WithOldMetricNames
from router.children.pool import WorkerPool

UNMATCHED = "unmatched"  # the route label of a path no route serves (scanners, typos): one series for all
MODEL_STATES = ("unloaded", "provisioning", "converting", "loading", "idle", "ready", "restarting", "unloading",
                "down")


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("mlxd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


class PoolCollector(Collector):
    """The gauges, and the counters the children report, read from the pool when scraped."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        pool, metrics = self.pool, self.pool.metrics
        info = GaugeMetricFamily("mlxd_build_info", "the running mlxd's version (always 1)", labels=["version"])
        info.add_metric([_version()], 1)
        yield info
        yield GaugeMetricFamily("mlxd_start_time_seconds", "when the router started (unix time)",
                                value=pool.started_at)
        yield GaugeMetricFamily("mlxd_memory_budget_bytes", "the memory budget models are loaded under",
                                value=pool.memory.budget_bytes)
        yield GaugeMetricFamily("mlxd_memory_used_bytes",
                                "memory charged to loaded models (per model the larger of its estimate and its RSS)",
                                value=pool.used_bytes())
        yield from self._models()
        yield from self._sequences()
        yield from self._hot_tier()
        yield from self._cold_tier()
        yield from self._hit_ratios()
        yield from self._rss()
        for name, help_text, label_names, series in metrics.child_counter_families():
            family = CounterMetricFamily(name, help_text, labels=label_names)
            for labels, value in series:
                family.add_metric(list(labels), value)
            yield family

    def _models(self) -> Iterator[Metric]:
        pool = self.pool
        state = GaugeMetricFamily("mlxd_model_state", "1 for each model's current state", labels=["model", "state"])
        loaded = GaugeMetricFamily("mlxd_model_loaded", "1 if the model's worker is running", labels=["model"])
        pinned = GaugeMetricFamily("mlxd_model_pinned", "1 if the model is pinned (never evicted)", labels=["model"])
        for model_id in pool.models:
            current = pool.state_of(model_id)
            for name in (*MODEL_STATES, *([current] if current not in MODEL_STATES else [])):
                state.add_metric([model_id, name], 1 if name == current else 0)
            loaded.add_metric([model_id], 1 if model_id in pool.supervisors
                              and pool.supervisors[model_id].state != "down" else 0)
            pinned.add_metric([model_id], 1 if model_id in pool.pinned else 0)
        yield from (state, loaded, pinned)

    def _sequences(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("mlxd_running_sequences", "generations in prefill or decoding, per model",
                                    labels=["model"])
        queued = GaugeMetricFamily("mlxd_queued_sequences",
                                   "generations sent to a worker that have not started their prefill, per model",
                                   labels=["model"])
        counts: dict[str, list[int]] = {m: [0, 0] for m in self.pool.supervisors}
        for stream in self.pool.generation_streams():
            counts.setdefault(stream.model, [0, 0])[0 if stream.phase == "queued" else 1] += 1
        for model_id, (num_queued, num_running) in sorted(counts.items()):
            running.add_metric([model_id], num_running)
            queued.add_metric([model_id], num_queued)
        yield from (running, queued)

    def _hot_tier(self) -> Iterator[Metric]:
        size = GaugeMetricFamily("mlxd_hot_tier_bytes", "KV bytes in a worker's hot tier (RAM)", labels=["model"])
        budget = GaugeMetricFamily("mlxd_hot_tier_budget_bytes", "a worker's hot-tier budget", labels=["model"])
        blocks = GaugeMetricFamily("mlxd_hot_tier_blocks", "blocks in a worker's hot tier", labels=["model"])
        queue = GaugeMetricFamily("mlxd_write_behind_queue_blocks",
                                  "blocks waiting in a worker's queue for the SSD cold tier", labels=["model"])
        for model_id, supervisor in sorted(self.pool.supervisors.items()):
            if supervisor.state != "ready" or supervisor.last_pong is None or supervisor.kind != "chat":
                continue
            stats = supervisor.last_pong.stats or {}
            size.add_metric([model_id], stats.get("hot_bytes", 0))
            budget.add_metric([model_id], supervisor.ready.hot_tier_bytes if supervisor.ready else 0)
            blocks.add_metric([model_id], stats.get("hot_blocks", 0))
            queue.add_metric([model_id], stats.get("cold_write_queue", 0))
        yield from (size, budget, blocks, queue)

    def _cold_tier(self) -> Iterator[Metric]:
        pool = self.pool
        up = GaugeMetricFamily("mlxd_cold_tier_up", "1 if the SSD cold tier (the kvstore) is ready; absent when it is off")
        disk = GaugeMetricFamily("mlxd_cold_tier_disk_bytes", "bytes the SSD cold tier's segments take on disk")
        max_bytes = GaugeMetricFamily("mlxd_cold_tier_max_bytes", "the SSD cold tier's size cap")
        segments = GaugeMetricFamily("mlxd_cold_tier_segments", "segment files of the SSD cold tier")
        size = GaugeMetricFamily("mlxd_cold_tier_bytes", "live KV bytes in the SSD cold tier, per model",
                                 labels=["model"])
        blocks = GaugeMetricFamily("mlxd_cold_tier_blocks", "blocks in the SSD cold tier, per model", labels=["model"])
        if pool.kvstore is None:
            return
        up.add_metric([], 1 if pool.kvstore.state == "ready" else 0)
        yield up
        stats = pool.metrics.kvstore_stats
        if stats is None:
            return
        for family, key in ((disk, "disk_bytes"), (max_bytes, "max_disk_bytes"), (segments, "num_segments")):
            if isinstance(stats.get(key), (int, float)):
                family.add_metric([], stats[key])
                yield family
        for namespace, figures in sorted((stats.get("namespaces") or {}).items()):
            size.add_metric([namespace], figures.get("bytes", 0))
            blocks.add_metric([namespace], figures.get("blocks", 0))
        yield from (size, blocks)

    def _hit_ratios(self) -> Iterator[Metric]:
        """The share of prompt tokens each cache tier served over the history's trailing
        window (for a glance; rate() over mlxd_prompt_tokens_total is the exact form)."""
        ratio = GaugeMetricFamily("mlxd_prompt_cache_hit_ratio",
                                  f"share of the prompt tokens of the last {HIT_RATE_WINDOW_S:.0f} s served from a "
                                  "cache tier (hot: RAM, cold: the cold tier on SSD)", labels=["tier"])
        points = self.pool.metrics.history.points(shown_s=0.0)
        if points:
            last = points[-1]
            for tier in ("hot", "cold"):
                if last[f"{tier}_hit_rate"] is not None:
                    ratio.add_metric([tier], last[f"{tier}_hit_rate"])
        yield ratio

    def _rss(self) -> Iterator[Metric]:
        rss = GaugeMetricFamily("mlxd_process_resident_memory_bytes",
                                "resident memory of each mlxd process, by role (router, worker, kvstore)",
                                labels=["role", "model"])
        own = _rss(os.getpid())
        if own is not None:
            rss.add_metric(["router", ""], own)
        for model_id, supervisor in sorted(self.pool.supervisors.items()):
            value = _rss(supervisor.pid)
            if value is not None:
                rss.add_metric(["worker", model_id], value)
        if self.pool.kvstore is not None:
            value = _rss(self.pool.kvstore.pid)
            if value is not None:
                rss.add_metric(["kvstore", ""], value)
        yield rss


def watch(pool: WorkerPool) -> None:
    """Register `pool`'s scrape-time collector on its registry (once per pool)."""
    if not pool.metrics.collector_registered:
        pool.metrics.registry.register(PoolCollector(pool))
        pool.metrics.collector_registered = True


async def metrics(request: Request) -> Response:
    """GET /metrics: the registry in Prometheus' text format, renamed metrics under their
    old names too (`router.old_names`); the kvstore's counters are asked for first, so the
    cold tier's figures are current."""
    pool: WorkerPool = request.app.state.pool
    await pool.kvstore_stats()
    return Response(generate_latest(WithOldMetricNames(pool.metrics.registry)),  # type: ignore[arg-type]
                    media_type=CONTENT_TYPE_LATEST)


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path template of the route serving `scope` (`/v1/chat/completions`,
    `/admin/models/{model_id:path}/load`), so a model name or a scanner's path never makes a
    series of its own; UNMATCHED when no route serves it."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "path", UNMATCHED)
        if match == Match.PARTIAL and partial is None:  # the path, another method
            partial = getattr(route, "path", UNMATCHED)
    return partial or UNMATCHED


class RequestMetricsMiddleware:
    """Counts each answered HTTP request in mlxd_requests_total by route template, model
    (what the request resolved to; empty when it names none or was refused before) and
    status code. Outside the key check and the gates, so their refusals count too; a pure
    ASGI middleware, so streams pass untouched."""

    def __init__(self, app: ASGIApp, pool: WorkerPool, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.pool = pool
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_template(self.routes, scope)
        state = scope.setdefault("state", {})
        status = 500  # an exception before any answer: the server error handler's status

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            model = state.get("model", "") if isinstance(state, dict) else ""
            self.pool.metrics.observe_request(route, model if isinstance(model, str) else "", status)
