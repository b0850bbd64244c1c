"""PrefixCache.stats: every counter of both tiers leaves the worker with its pong, and a
worker without a cold tier reports its counters as zeros."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tests.worker.tiny_models import make_tiny
from worker.cold_tier import ColdTierStats
from worker.prefix_cache import PrefixCache

REPORTED_AS = {  # ColdTierStats field -> its key in the pong's stats
    "fetched_blocks": "cold_fetched_blocks",
    "fetch_s": "cold_fetch_s",
    "corrupt_blocks": "cold_corrupt_blocks",
    "read_timeouts": "cold_read_timeouts",
    "skipped_fetches": "cold_skipped_fetches",
    "queued_blocks": "cold_queued_blocks",
    "dropped_blocks": "cold_dropped_blocks",
}


class _ColdStub:
    """Just what `stats` reads of a ColdTier."""

    def __init__(self) -> None:
        self.stats = ColdTierStats(*range(1, len(REPORTED_AS) + 1))

    def queue_depth(self) -> int:
        return 9


def test_every_cold_tier_counter_is_reported(default_model_dir: Path) -> None:
    assert set(asdict(ColdTierStats())) == set(REPORTED_AS), "a new counter must be reported too"
    tiny = make_tiny("llama", default_model_dir)
    cold = _ColdStub()
    stats = PrefixCache(tiny.model, tiny.fingerprint, 32, 1 << 20, cold=cold).stats()
    assert {key: stats[key] for key in REPORTED_AS.values()} == {
        REPORTED_AS[name]: value for name, value in asdict(cold.stats).items()
    }
    assert stats["cold_write_queue"] == 9
    without = PrefixCache(tiny.model, tiny.fingerprint, 32, 1 << 20).stats()
    assert all(without[key] == 0 for key in [*REPORTED_AS.values(), "cold_write_queue"])
