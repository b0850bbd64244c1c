"""The router's metrics without a model: child counters stay monotonic across restarts, a
generation's tokens are split by source, the history's rates and hit rates, the route
template label, and the exposition parses."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Mount, Route

from protocol.messages import FinishEvent, Timings, Usage
from router.metrics import ChildCounters, History, Metrics, Totals
from router.metrics_route import UNMATCHED, route_template
from router.cli.status import format_top, sparkline
from router.old_names import WithOldMetricNames


def test_child_counters_stay_monotonic_when_a_child_restarts() -> None:
    counters = ChildCounters()
    counters.observe("1:m#1", ("m",), {"hits": 5})
    counters.observe("1:m#1", ("m",), {"hits": 9})
    assert counters.total("hits", ("m",)) == 9
    counters.observe("1:m#2", ("m",), {"hits": 2})  # restarted: counts from zero again
    assert counters.total("hits", ("m",)) == 11
    counters.observe("1:m#2", ("m",), {"hits": 2})  # no change
    counters.observe("1:m#2", ("m",), {"hits": 1})  # reset without a restart: counts in full
    assert counters.total("hits", ("m",)) == 12
    counters.observe("2:m#1", ("m",), {"hits": 30})  # a new supervisor, same identity string
    assert counters.total("hits", ("m",)) == 42
    counters.observe("9:other#1", ("other",), {"hits": 1})
    assert counters.series("hits") == [(("m",), 42.0), (("other",), 1.0)]


def _finish(prompt: int, cached: int, cold: int, completion: int) -> FinishEvent:
    return FinishEvent("r", "stop", Usage(prompt, completion, cached, cold, cold * 1000),
                       Timings(queue_s=0.01, prefill_s=0.2, ttft_s=0.25, cold_fetch_s=0.03 if cold else 0.0))


def _samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(WithOldMetricNames(metrics.registry)).decode()  # as GET /metrics serves it
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_generation_counts_its_prompt_tokens_by_source_and_its_timings() -> None:
    metrics = Metrics()
    metrics.observe_finish("m", _finish(prompt=1000, cached=768, cold=512, completion=20), duration_s=1.5)
    metrics.observe_finish("m", _finish(prompt=100, cached=0, cold=0, completion=5), duration_s=0.5)
    samples = _samples(metrics)

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    assert value("mlxd_prompt_tokens_total", model="m", source="hot") == 256
    assert value("mlxd_prompt_tokens_total", model="m", source="cold") == 512
    assert ("mlxd_prompt_tokens_total", frozenset({("model", "m"), ("source", "ssd")})) not in samples  # no double
    assert value("mlxd_prompt_tokens_total", model="m", source="computed") == 232 + 100
    assert value("mlxd_generated_tokens_total", model="m") == 25
    assert value("mlxd_time_to_first_token_seconds_count", model="m") == 2
    assert value("mlxd_request_duration_seconds_sum", model="m") == 2.0
    assert value("mlxd_cold_tier_restore_seconds_count", model="m") == 1  # only the request that restored
    assert value("mlxd_cold_tier_restored_bytes_total", model="m") == 512_000
    # the old names until 0.2 (router.old_names), every sample repeated
    assert value("mlxd_ssd_restore_seconds_count", model="m") == 1
    assert value("mlxd_ssd_restore_seconds_bucket", model="m", le="+Inf") == 1
    assert value("mlxd_ssd_restored_bytes_total", model="m") == 512_000
    assert metrics.totals.as_json() == {"requests": 2, "generated_tokens": 25,
                                        "prompt_tokens": {"hot": 256, "cold": 512, "computed": 332, "ssd": 512}}
    assert not any(name.endswith("_created") for name, _ in samples)


def test_history_points_are_rates_and_trailing_hit_rates() -> None:
    history = History(interval_s=2.0)
    totals = Totals()
    history.record(totals, 0, 0, now=100.0)
    totals.requests, totals.generated_tokens = 1, 40
    totals.prompt_tokens.update(hot=300, cold=100, computed=100)
    history.record(totals, 2, 1, now=102.0)
    history.record(totals, 0, 0, now=104.0)
    first, second = history.points()
    assert first["generated_tok_s"] == 20.0 and first["prompt_tok_s"] == 250.0 and first["requests_per_s"] == 0.5
    assert first["hot_hit_rate"] == 0.6 and first["cold_hit_rate"] == 0.2
    assert (first["running"], first["queued"]) == (2, 1)
    assert first["ssd_hit_rate"] == 0.2  # the old name, until 0.2
    assert second["generated_tok_s"] == 0.0 and second["hot_hit_rate"] == 0.6  # still within the 30 s window
    history.record(totals, 0, 0, now=200.0)
    assert history.points()[-1]["hot_hit_rate"] is None  # no prompt tokens in the last 30 s


def test_the_route_label_is_the_template() -> None:
    async def endpoint(request: object) -> None: ...

    routes = [Route("/v1/chat/completions", endpoint, methods=["POST"]),
              Route("/admin/models/{model_id:path}/load", endpoint, methods=["POST"]),
              Mount("/admin/dashboard", routes=[])]

    def scope(method: str, path: str) -> dict[str, object]:
        return {"type": "http", "method": method, "path": path, "root_path": ""}

    assert route_template(routes, scope("POST", "/v1/chat/completions")) == "/v1/chat/completions"
    assert route_template(routes, scope("GET", "/v1/chat/completions")) == "/v1/chat/completions"  # a 405
    assert route_template(routes, scope("POST", "/admin/models/org/m/load")) == "/admin/models/{model_id:path}/load"
    assert route_template(routes, scope("GET", "/admin/dashboard/dashboard.js")) == "/admin/dashboard"
    assert route_template(routes, scope("GET", "/wp-login.php")) == UNMATCHED


def test_the_top_lines_match_the_dashboards_top_panel() -> None:
    status = {"version": "0.1.0", "uptime_s": 65, "memory": {"used_bytes": 1 << 30, "budget_bytes": 4 << 30,
                                                              "available_bytes": 8 << 30, "total_bytes": 16 << 30},
              "requests": [{"id": "a", "route": "/v1/chat/completions", "state": "decoding"},
                           {"id": "b", "route": "/v1/messages", "state": "queued"},
                           {"id": "c", "route": None, "state": "queued"}],
              "totals": {"requests": 7, "generated_tokens": 90, "prompt_tokens": {"hot": 5, "cold": 6, "computed": 7}},
              "history": {"hit_rate_window_s": 30, "points": [
                  {"t": 0.0, "generated_tok_s": 0.0, "hot_hit_rate": None, "cold_hit_rate": None},
                  {"t": 2.0, "generated_tok_s": 30.0, "hot_hit_rate": 0.5, "cold_hit_rate": 0.25}]}}
    lines = format_top(status, "http://h:1")
    assert lines[0] == "mlxd 0.1.0 at http://h:1, up 1m05s"
    assert "[#####...............]" in lines[1]
    assert lines[2].startswith("requests: 7 served, 2 in flight (1 queued); tokens: 90 generated")
    assert "prompt 5 hot / 6 cold / 7 computed" in lines[2] and "50% hot, 25% cold" in lines[2]
    assert lines[3].startswith("generated tok/s: 30.0 now, peak 30.0")
    assert sparkline([0, 1, 2, 4], width=4) == "▁▃▅█" and sparkline([0, 0]) == "▁▁" and sparkline([]) == ""
    assert len(sparkline(list(range(300)), width=60)) == 60


def test_throughput_follows_streaming_tokens_and_never_goes_negative() -> None:
    history = History(interval_s=1.0)
    totals = Totals()
    history.record(totals, 1, 0, now=0.0, streaming_tokens=0)
    history.record(totals, 1, 0, now=1.0, streaming_tokens=30)  # still running: counted as it streams
    totals.requests, totals.generated_tokens = 1, 40
    history.record(totals, 0, 0, now=2.0, streaming_tokens=0)  # finished with 40
    totals.generated_tokens = 40
    history.record(totals, 1, 0, now=3.0, streaming_tokens=0)
    rates = [p["generated_tok_s"] for p in history.points()]
    assert rates == [30.0, 10.0, 0.0]
    history.record(totals, 0, 0, now=4.0, streaming_tokens=0)
    totals_after_failure = Totals(requests=1, generated_tokens=40)
    history.record(totals_after_failure, 1, 0, now=5.0, streaming_tokens=5)
    history.record(totals_after_failure, 0, 0, now=6.0, streaming_tokens=0)  # that request failed
    assert history.points()[-1]["generated_tok_s"] == 0.0


def test_uncached_tokens_are_counted_by_why() -> None:
    from protocol.cache_misses import CacheMisses, Divergence

    metrics = Metrics()
    misses = CacheMisses({"diverged": 520, "evicted": 25}, 512, Divergence(2071, 3, "user", "content"))
    metrics.observe_finish("m", FinishEvent("r", "stop", Usage(2593, 3, 2048, 512, 1, misses)), None)
    metrics.observe_finish("m", FinishEvent("r", "stop", Usage(30, 3, 0, misses=CacheMisses({"diverged": 30}))), None)
    metrics.observe_finish("m", _finish(prompt=100, cached=0, cold=0, completion=5), None)  # no prefix cache
    samples = _samples(metrics)
    name = "mlxd_prefix_miss_tokens_total"
    assert samples[(name, frozenset({("model", "m"), ("reason", "diverged")}))] == 550
    assert samples[(name, frozenset({("model", "m"), ("reason", "evicted")}))] == 25
    assert samples[(name, frozenset({("model", "m"), ("reason", "evicted_hot_found_cold")}))] == 512
    assert (name, frozenset({("model", "m"), ("reason", "first_seen")})) not in samples
