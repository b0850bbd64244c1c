"""router.children.pool with fake workers (real processes, no MLX): three models under a budget
that holds two; loading the third evicts the least recently used, the one the requests
left alone, not merely the first loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from router.config import make_config
from router.model_registry import RUNTIME_OVERHEAD_BYTES
from router.children.pool import WorkerPool
from tests.router.router_harness import FAKE_WORKER, FAST

pytestmark = pytest.mark.timeout(120)

HOT = 1 << 20
NEED = HOT + RUNTIME_OVERHEAD_BYTES  # a fake model has no weights: hot tier + runtime
MODELS = ("a", "b", "c")


def make_pool(tmp_path: Path) -> WorkerPool:
    dirs = {}
    for model_id in MODELS:
        dirs[model_id] = tmp_path / model_id
        dirs[model_id].mkdir()
        (dirs[model_id] / "config.json").write_text("{}")
    config = make_config({**FAST, "home": tmp_path / "home", "hot_tier_bytes": HOT, "cold_tier": False,
                          "embedding_model": "", "memory_budget_bytes": 2 * NEED + NEED // 2})
    pool = WorkerPool(config, dirs, worker_command=FAKE_WORKER)
    pool.names.preload.clear()  # loaded by the test, in its order
    return pool


@pytest.mark.parametrize(("used_last", "evicted"), [
    ("a", "b"),  # a was loaded first but used since: b is the least recently used
    ("b", "a"),
])
def test_the_third_model_evicts_the_least_recently_used(tmp_path: Path, used_last: str, evicted: str) -> None:
    pool = make_pool(tmp_path)

    async def run() -> list[str]:
        await pool.start()
        try:
            await pool.load("a")
            await pool.load("b")
            await asyncio.sleep(0.05)  # a clock tick between the loads' stamps and the use
            await pool.acquire(used_last)  # what a request does before it is sent
            await pool.load("c")
            return sorted(pool.supervisors)
        finally:
            await pool.stop()

    loaded = asyncio.run(run())
    assert loaded == sorted({*MODELS} - {evicted})
    assert pool.metrics.registry.get_sample_value(
        "mlxd_model_unloads_total", {"model": evicted, "reason": "evicted"}) == 1
