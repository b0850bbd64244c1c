"""The old names of renamed output fields and metrics, sent beside the new ones until mlxd
0.2 (README: "Renamed settings"), so a script or a dashboard written against them keeps
working meanwhile. The one module that spells them: the code everywhere else says "cold
tier", never "ssd" (tests/test_house_rules.py holds it to that). Values cannot have two
names: a probe block's `tier` and the `source`/`tier` label values of the metrics say
`cold` only (a second series would double every sum over the label).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

# JSON: new key -> old key, per object the router answers with
USAGE_CACHE = {"cold_tokens": "ssd_tokens", "cold_bytes": "ssd_bytes"}  # `mlxd.cache` of an answer
TIMINGS = {"cold_fetch_s": "ssd_fetch_s"}  # `mlxd.timings` of an answer
PROBE = {"cold_tokens": "ssd_tokens", "cold_blocks": "ssd_blocks"}  # POST /admin/cache/probe
PROBE_BLOCK = {"in_cold_tier": "on_ssd"}  # each of a probe's `blocks`
SNAPSHOT = {"cold": "ssd"}  # a snapshot of /admin/cache/snapshots
STATUS_MODEL = {"hot_tier": "hot_cache"}  # /admin/status `models[]`
STATUS_REQUEST = {"generated_tokens": "tokens"}  # /admin/status `requests[]`
PROMPT_SOURCES = {"cold": "ssd"}  # /admin/status `totals.prompt_tokens`
HISTORY_POINT = {"cold_hit_rate": "ssd_hit_rate"}  # /admin/status `history.points[]`

# Prometheus: new family name -> old (counters without `_total`); every sample is repeated
METRICS = {
    "mlxd_cold_tier_restore_seconds": "mlxd_ssd_restore_seconds",
    "mlxd_cold_tier_restored_bytes": "mlxd_ssd_restored_bytes",
    "mlxd_cold_tier_restored_blocks": "mlxd_ssd_restored_blocks",
    "mlxd_cold_tier_read_timeouts": "mlxd_ssd_read_timeouts",
    "mlxd_cold_tier_corrupt_blocks": "mlxd_ssd_corrupt_blocks",
}


def with_old_keys(body: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """`body`, with the value of each of its `renamed` keys also under the old name
    (changed in place, and returned for use in an expression)."""
    for new, old in renamed.items():
        if new in body:
            body[old] = body[new]
    return body


class Collects(Protocol):
    def collect(self) -> Iterator[Metric]: ...


class WithOldMetricNames:
    """What `registry` collects, each renamed family (METRICS) followed by a copy under its
    old name: what `GET /metrics` serves (`prometheus_client.generate_latest` takes it as
    it takes a registry)."""

    def __init__(self, registry: Collects) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            yield family
            old = METRICS.get(family.name)
            if old is not None:
                copy = Metric(old, f"{family.documentation} (the old name of {family.name}, until mlxd 0.2)",
                              family.type, family.unit)
                copy.samples = [s._replace(name=old + s.name[len(family.name):]) for s in family.samples]
                yield copy
