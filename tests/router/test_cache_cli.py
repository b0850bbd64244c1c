"""`mlxd cache`: the /admin/cache answers as the lines a person reads (absent figures print
as "-"), and what a clear removed, notes included."""

from __future__ import annotations

import pytest

from router.cli.cache import format_cleared, format_stats

STATS = {
    "models": [
        {"id": "qwen2.5-coder-0.5b", "state": "ready",
         "hot_tier": {"blocks": 40, "bytes": 120 << 20, "budget_bytes": 1536 << 20, "hits": 63, "misses": 37,
                      "hit_rate": 0.63},
         "cold_tier": {"blocks": 90, "bytes": 300 << 20, "hits": 12, "misses": 4, "hit_rate": 0.75}},
        {"id": "SmolLM2-135M-Instruct", "state": "unloaded", "hot_tier": None,
         "cold_tier": {"blocks": 0, "bytes": 0, "hits": 0, "misses": 0, "hit_rate": None}},
    ],
    "cold_tier": {"state": "ready", "blocks": 95, "bytes": 310 << 20, "max_bytes": 10 << 30, "hits": 12,
                  "misses": 4, "hit_rate": 0.75},
}


def test_stats_table_has_a_row_per_model_and_the_store() -> None:
    lines = format_stats(STATS, "http://127.0.0.1:8000").splitlines()
    qwen = next(line for line in lines if line.startswith("qwen2.5-coder-0.5b")).split()
    assert qwen[:3] == ["qwen2.5-coder-0.5b", "ready", "40"]
    assert "120.0 MiB / 1.5 GiB" in " ".join(qwen) and "63%" in qwen and "90" in qwen and "75%" in qwen
    smol = next(line for line in lines if line.startswith("SmolLM2")).split()
    assert smol[1:6] == ["unloaded", "-", "-", "-", "-"]  # no hot tier: not loaded
    assert lines[-1] == "cold tier (ready): 95 blocks, 310.0 MiB of 10.0 GiB, 12 hits, hit 75%"


def test_stats_name_the_snapshots_pinning_the_cold_tier() -> None:
    stats = {**STATS, "cold_tier": {**STATS["cold_tier"], "snapshots": 2, "pinned_blocks": 7, "pinned_bytes": 21 << 20}}
    lines = format_stats(stats, "http://x").splitlines()
    assert lines[-1] == "snapshots: 2, pinning 7 blocks (21.0 MiB) in the cold tier (GET /admin/cache/snapshots)"


@pytest.mark.parametrize("cold, last_line", [
    (None, "cold tier: off"),
    ({"state": "restarting", "blocks": None, "bytes": None, "max_bytes": None, "hits": None, "misses": None,
      "hit_rate": None}, "cold tier (restarting): - blocks, - of -, - hits, hit -"),
])
def test_stats_without_a_cold_tier_figure(cold, last_line) -> None:
    stats = {"models": [{**STATS["models"][0], "cold_tier": None}], "cold_tier": cold}
    lines = format_stats(stats, "http://x").splitlines()
    assert lines[-1] == last_line
    assert next(line for line in lines if line.startswith("qwen")).split()[-4:] == ["-"] * 4


@pytest.mark.parametrize("answer, expected", [
    ({"model": "m", "models": [{"id": "m", "loaded": True,
                                "hot_tier": {"blocks": 8, "bytes": 3 << 20, "dropped_writes": 2}}],
      "cold_tier": {"namespace": "m", "blocks": 6}, "notes": []},
     ["m: removed 8 hot blocks (3.0 MiB), dropped 2 pending SSD writes", "cold tier: removed 6 blocks (model m)"]),
    ({"model": None, "models": [{"id": "a", "loaded": True, "hot_tier": {"blocks": 0, "bytes": 0,
                                                                        "dropped_writes": 0}},
                                {"id": "b", "loaded": False, "hot_tier": None}],
      "cold_tier": {"namespace": None, "blocks": 11}, "notes": []},
     ["a: removed 0 hot blocks (0 B)", "b: not loaded, no hot tier", "cold tier: removed 11 blocks (every model)"]),
    ({"model": "b", "models": [{"id": "b", "loaded": False, "hot_tier": None}], "cold_tier": None,
      "notes": ["model 'b' is not loaded (unloaded): it has no hot tier; nothing was cleared",
                "the cold tier is off (--no-cold-tier)"]},
     ["b: not loaded, no hot tier",
      "note: model 'b' is not loaded (unloaded): it has no hot tier; nothing was cleared",
      "note: the cold tier is off (--no-cold-tier)"]),
])
def test_cleared_says_what_each_tier_removed(answer, expected) -> None:
    assert format_cleared(answer).splitlines() == expected
