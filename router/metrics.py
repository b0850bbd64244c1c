"""The router's Prometheus registry (`GET /metrics`) and the short history the dashboard draws.

The router is the only process scraped. It counts what it sees itself (requests and their
status, each generation's tokens and timings from its FinishEvent, model loads, unloads and
restarts), and turns what the children report over the existing protocol (a worker's pong
stats, the kvstore's KVStats answer) into counters that stay monotonic although every child
counts from zero when it (re)starts: `ChildCounters` adds each report's increase over the
previous report of the same child, and a report from a new child counts in full. Gauges
(bytes, blocks, sequences, RSS) are read when scraped, by `router.metrics_route`'s collector.

Nothing here imports the pool: the pool owns a `Metrics` and calls into it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

from protocol.cache_misses import REASONS
from protocol.messages import FinishEvent
from router import old_names

# no `_created` series beside every counter and histogram: scrapers do not need them, and
# they would double what a person reading /metrics has to skip
disable_created_metrics()

# seconds: a first token within tens of ms on a hot prefix, minutes on a long cold prompt
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
RESTORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOAD_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

PROMPT_SOURCES = ("hot", "cold", "computed")  # where a prompt token's KV came from

# child-reported counters: the report's field -> (metric name without _total, help)
WORKER_COUNTERS: dict[str, tuple[str, str]] = {
    "hits": ("mlxd_hot_tier_hits", "prefix blocks found in a worker's hot tier (RAM)"),
    "misses": ("mlxd_hot_tier_misses", "prefix block lookups that missed a worker's hot tier"),
    "inserts": ("mlxd_hot_tier_inserts", "blocks stored into a worker's hot tier"),
    "evictions": ("mlxd_hot_tier_evictions", "blocks evicted from a worker's hot tier (LRU, over its budget)"),
    "cold_fetched_blocks": ("mlxd_cold_tier_restored_blocks", "blocks a worker restored from the cold tier (SSD)"),
    "cold_read_timeouts": ("mlxd_cold_tier_read_timeouts",
                           "cold-tier reads a worker gave up on (the kvstore was slow)"),
    "cold_corrupt_blocks": ("mlxd_cold_tier_corrupt_blocks", "blocks read from the cold tier that failed to decode"),
    "cold_queued_blocks": ("mlxd_write_behind_queued_blocks", "blocks a worker queued for writing to the SSD cold tier"),
    "cold_dropped_blocks": ("mlxd_write_behind_dropped_blocks",
                            "blocks a worker dropped from its SSD write-behind queue (full, or cleared)"),
    "steps": ("mlxd_engine_steps", "batch steps a worker ran (decode steps and prefill chunks)"),
    "step_rows": ("mlxd_engine_step_rows", "sequences decoding, summed over steps (/ steps: the mean batch)"),
    "step_seconds": ("mlxd_engine_step_seconds", "host time in a worker's steps, tokens handed out included"),
    "step_generate_seconds": ("mlxd_engine_step_generate_seconds",
                              "host time inside the batch generator: building and running the steps"),
    "grammar_wait_seconds": ("mlxd_grammar_wait_seconds",
                             "time constrained steps waited for the step before to read its tokens"),
    "grammar_mask_seconds": ("mlxd_grammar_mask_seconds",
                             "time the grammar engine spent consuming tokens and computing masks"),
}
KVSTORE_COUNTERS: dict[str, tuple[str, str]] = {
    "puts": ("mlxd_cold_tier_writes", "blocks the kvstore wrote to the SSD cold tier"),
    "dropped": ("mlxd_cold_tier_dropped_writes", "blocks the kvstore refused to store (bigger than a cap allows)"),
    "evictions": ("mlxd_cold_tier_evictions", "blocks evicted from the SSD cold tier (over its size cap)"),
    "corrupt": ("mlxd_cold_tier_corrupt_records", "damaged records the kvstore found and dropped"),
    "compactions": ("mlxd_cold_tier_compactions", "segment compactions the kvstore ran"),
}
KVSTORE_NAMESPACE_COUNTERS: dict[str, tuple[str, str]] = {
    "hits": ("mlxd_cold_tier_hits", "prefix blocks found in the SSD cold tier, per model"),
    "misses": ("mlxd_cold_tier_misses", "prefix block lookups that missed the SSD cold tier, per model"),
}

HISTORY_INTERVAL_S = 2.0  # one sample of the totals every this long
HISTORY_KEEP_S = 600.0  # samples kept
HISTORY_SHOWN_S = 300.0  # what /admin/status shows
HIT_RATE_WINDOW_S = 30.0  # a point's hit rates are over the prompt tokens of this trailing window


class ChildCounters:
    """Monotonic totals of counters that child processes report as "since I started".

    `observe(source, labels, values)`: `source` names one child process (its supervisor and
    generation), `labels` the series. A report adds its increase over the last report of the
    same source for that series; a new source (the child restarted) starts from zero, so its
    first report counts in full; a value that went down (a counter reset without a restart)
    counts in full too. What a child counted after its last report before it died is lost:
    at most one heartbeat's worth.
    """

    def __init__(self) -> None:
        self._totals: dict[str, dict[tuple[str, ...], float]] = collections.defaultdict(dict)
        self._last: dict[tuple[str, tuple[str, ...]], tuple[str, float]] = {}

    def observe(self, source: str, labels: tuple[str, ...], values: Mapping[str, float]) -> None:
        for name, value in values.items():
            value = float(value)
            key = (name, labels)
            last_source, last = self._last.get(key, (source, 0.0))
            if last_source != source or value < last:
                last = 0.0
            series = self._totals[name]
            series[labels] = series.get(labels, 0.0) + (value - last)
            self._last[key] = (source, value)

    def series(self, name: str) -> list[tuple[tuple[str, ...], float]]:
        return sorted(self._totals.get(name, {}).items())

    def total(self, name: str, labels: tuple[str, ...]) -> float:
        return self._totals.get(name, {}).get(labels, 0.0)


@dataclass
class Totals:
    """What the router counted since it started, over every model (the dashboard's numbers)."""

    requests: int = 0  # generations finished (a FinishEvent)
    generated_tokens: int = 0
    prompt_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROMPT_SOURCES, 0))

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "generated_tokens": self.generated_tokens,
                "prompt_tokens": old_names.with_old_keys(dict(self.prompt_tokens), old_names.PROMPT_SOURCES)}


@dataclass(frozen=True)
class Sample:
    t: float  # unix time
    requests: int
    generated_tokens: int
    prompt_tokens: tuple[int, ...]  # in PROMPT_SOURCES order
    running: int
    queued: int


class History:
    """The totals every HISTORY_INTERVAL_S for the last HISTORY_KEEP_S, as rates per point."""

    def __init__(self, interval_s: float = HISTORY_INTERVAL_S, keep_s: float = HISTORY_KEEP_S) -> None:
        self.interval_s = interval_s
        self.samples: collections.deque[Sample] = collections.deque(maxlen=int(keep_s / interval_s) + 1)

    def record(self, totals: Totals, running: int, queued: int, now: float | None = None,
               streaming_tokens: int = 0) -> None:
        """`streaming_tokens`: what the requests still running generated so far, so the
        throughput follows the tokens as they stream rather than jumping when requests end."""
        self.samples.append(Sample(time.time() if now is None else now, totals.requests,
                                   totals.generated_tokens + streaming_tokens,
                                   tuple(totals.prompt_tokens[s] for s in PROMPT_SOURCES), running, queued))

    def points(self, shown_s: float = HISTORY_SHOWN_S, window_s: float = HIT_RATE_WINDOW_S) -> list[dict[str, Any]]:
        """One point per sample of the last `shown_s` (the first sample has no rate): tokens
        and requests per second since the previous sample, and the share of prompt tokens
        served from the hot tier and the cold tier over the trailing `window_s` (None: no prompt
        tokens in that window)."""
        samples = list(self.samples)
        if not samples:
            return []
        newest = samples[-1].t
        points = []
        start = 0
        for i in range(1, len(samples)):
            now, before = samples[i], samples[i - 1]
            if now.t < newest - shown_s:
                continue
            while samples[start].t < now.t - window_s and start < i - 1:
                start += 1
            dt = max(now.t - before.t, 1e-6)
            window = [a - b for a, b in zip(now.prompt_tokens, samples[start].prompt_tokens)]
            prompt_total = sum(window)
            points.append(old_names.with_old_keys({
                "t": round(now.t, 2),
                # never below zero: a request that failed takes its streamed tokens out of the sum
                "generated_tok_s": round(max(0, now.generated_tokens - before.generated_tokens) / dt, 2),
                "prompt_tok_s": round((sum(now.prompt_tokens) - sum(before.prompt_tokens)) / dt, 2),
                "requests_per_s": round((now.requests - before.requests) / dt, 3),
                "hot_hit_rate": round(window[0] / prompt_total, 3) if prompt_total else None,
                "cold_hit_rate": round(window[1] / prompt_total, 3) if prompt_total else None,
                "running": now.running,
                "queued": now.queued,
            }, old_names.HISTORY_POINT))
        return points

    def as_json(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "hit_rate_window_s": HIT_RATE_WINDOW_S, "points": self.points()}


class Metrics:
    """The router's registry, the counters it keeps itself, and the children's counters.

    One per pool (so a test running several routers in one process keeps them apart);
    `router.metrics_route` registers the scrape-time collector on `registry`.
    """

    def __init__(self) -> None:
        self.started_at = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("mlxd_requests", "HTTP requests answered, by route template, model and status code",
                                ["route", "model", "status"], registry=r)
        self.generations = Counter("mlxd_generations", "generations finished, by model and finish reason",
                                   ["model", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("mlxd_prompt_tokens",
                                     "prompt tokens of finished generations, by where their KV came from: the hot "
                                     "tier (RAM), the cold tier (SSD), or computed by prefill",
                                     ["model", "source"], registry=r)
        self.miss_tokens = Counter("mlxd_prefix_miss_tokens",
                                   "prompt tokens of finished generations the prefix cache did not serve, by why: "
                                   "first_seen, diverged, evicted (from both tiers), cache_salt, model_changed, "
                                   "partial_block; evicted_hot_found_cold counts cached tokens restored from SSD "
                                   "after the hot tier evicted them (not misses)", ["model", "reason"], registry=r)
        self.generated_tokens = Counter("mlxd_generated_tokens", "tokens generated (completion tokens)", ["model"],
                                        registry=r)
        self.draft_tokens = Counter("mlxd_draft_tokens", "draft tokens speculation proposed", ["model"], registry=r)
        self.draft_accepted = Counter("mlxd_draft_accepted_tokens", "draft tokens kept (the model's own next tokens)",
                                      ["model"], registry=r)
        self.ttft = Histogram("mlxd_time_to_first_token_seconds",
                              "time from the worker receiving a request to its first token", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("mlxd_queue_seconds", "time a request waited in the worker before its prefill began",
                               ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.prefill = Histogram("mlxd_prefill_seconds", "time spent computing a request's prompt (prefill)",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("mlxd_request_duration_seconds",
                                  "generation requests end to end: the router reading the request to its last token",
                                  ["model"], buckets=DURATION_BUCKETS, registry=r)
        self.restore = Histogram("mlxd_cold_tier_restore_seconds",
                                 "per request that restored prefix blocks from the cold tier: lookup, read and "
                                 "decode time", ["model"], buckets=RESTORE_BUCKETS, registry=r)
        self.restored_bytes = Counter("mlxd_cold_tier_restored_bytes", "KV bytes restored from the cold tier",
                                      ["model"], registry=r)
        self.loads = Counter("mlxd_model_loads", "models loaded (their worker became ready)", ["model"], registry=r)
        self.load_failures = Counter("mlxd_model_load_failures", "model loads that failed", ["model"], registry=r)
        self.load_time = Histogram("mlxd_model_load_seconds", "time to load a model: worker start to ready",
                                   ["model"], buckets=LOAD_BUCKETS, registry=r)
        self.unloads = Counter("mlxd_model_unloads",
                               "models unloaded, by why: admin (a route or the CLI), ttl (idle), evicted (to make "
                               "room under the memory budget)", ["model", "reason"], registry=r)
        self.worker_restarts = Counter("mlxd_worker_restarts",
                                       "worker processes restarted (after a crash or a hang, or on request)",
                                       ["model"], registry=r)
        self.kvstore_restarts = Counter("mlxd_kvstore_restarts", "kvstore processes restarted", registry=r)
        self.children = ChildCounters()
        self.totals = Totals()
        self.history = History()
        self.kvstore_stats: dict[str, Any] | None = None  # its last KVStats answer (None: none yet)
        self.collector_registered = False  # router.metrics_route.watch registers the scrape-time collector once

    # ---------------------------------------------------------------- what the router sees

    def observe_request(self, route: str, model: str, status: int) -> None:
        self.requests.labels(route, model, str(status)).inc()

    def observe_finish(self, model: str, event: FinishEvent, duration_s: float | None) -> None:
        """One generation's FinishEvent: its tokens by source and its timings."""
        usage, timings = event.usage, event.timings
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cold = min(usage.cold_tokens, cached)
        by_source = {"hot": cached - cold, "cold": cold, "computed": usage.prompt_tokens - cached}
        for source, count in by_source.items():
            self.prompt_tokens.labels(model, source).inc(count)
            self.totals.prompt_tokens[source] += count
        if usage.misses is not None:
            for reason, count in usage.misses.by_reason().items():
                if reason in REASONS and count > 0:
                    self.miss_tokens.labels(model, reason).inc(count)
        self.generated_tokens.labels(model).inc(usage.completion_tokens)
        if timings.draft_tokens:
            self.draft_tokens.labels(model).inc(timings.draft_tokens)
            self.draft_accepted.labels(model).inc(timings.draft_accepted)
        self.generations.labels(model, event.finish_reason or "unknown").inc()
        self.totals.requests += 1
        self.totals.generated_tokens += usage.completion_tokens
        self.ttft.labels(model).observe(timings.ttft_s)
        self.queue.labels(model).observe(timings.queue_s)
        self.prefill.labels(model).observe(timings.prefill_s)
        if duration_s is not None:
            self.duration.labels(model).observe(duration_s)
        if usage.cold_tokens:
            self.restore.labels(model).observe(timings.cold_fetch_s)
            self.restored_bytes.labels(model).inc(usage.cold_bytes)

    def observe_load(self, model: str, seconds: float | None) -> None:
        """A load that ended: `seconds` it took, or None if it failed."""
        if seconds is None:
            self.load_failures.labels(model).inc()
            return
        self.loads.labels(model).inc()
        self.load_time.labels(model).observe(seconds)

    def observe_unload(self, model: str, reason: str) -> None:
        self.unloads.labels(model, reason).inc()

    def observe_restart(self, role: str, model: str = "") -> None:
        if role == "kvstore":
            self.kvstore_restarts.inc()
        else:
            self.worker_restarts.labels(model).inc()

    # ---------------------------------------------------------------- what the children report

    def observe_worker_stats(self, model: str, source: str, stats: Mapping[str, Any]) -> None:
        """A worker's pong stats (`PrefixCache.stats`): its counters since it started."""
        self.children.observe(source, (model,), {"w:" + key: stats[key] for key in WORKER_COUNTERS
                                                 if isinstance(stats.get(key), (int, float))})

    def observe_kvstore_stats(self, source: str, stats: Mapping[str, Any]) -> None:
        """A KVStats answer: the store's totals since it opened, and per namespace (model)."""
        self.kvstore_stats = dict(stats)
        self.children.observe(source, (), {"kv:" + key: stats[key] for key in KVSTORE_COUNTERS
                                           if isinstance(stats.get(key), (int, float))})
        for namespace, figures in (stats.get("namespaces") or {}).items():
            if isinstance(figures, Mapping):
                self.children.observe(source, (namespace,), {
                    "ns:" + key: figures[key] for key in KVSTORE_NAMESPACE_COUNTERS
                    if isinstance(figures.get(key), (int, float))})

    def child_counter_families(self) -> Iterable[tuple[str, str, list[str], list[tuple[tuple[str, ...], float]]]]:
        """(name, help, label names, series) of every child-reported counter."""
        for field_name, (name, help_text) in WORKER_COUNTERS.items():
            yield name, help_text, ["model"], self.children.series("w:" + field_name)
        for field_name, (name, help_text) in KVSTORE_COUNTERS.items():
            yield name, help_text, [], self.children.series("kv:" + field_name)
        for field_name, (name, help_text) in KVSTORE_NAMESPACE_COUNTERS.items():
            yield name, help_text, ["model"], self.children.series("ns:" + field_name)

    def sample(self, running: int, queued: int, streaming_tokens: int = 0, now: float | None = None) -> None:
        self.history.record(self.totals, running, queued, now, streaming_tokens)
