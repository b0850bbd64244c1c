"""Hot tier bookkeeping: LRU by bytes, never over budget, longest-run lookup."""

from __future__ import annotations

import random

import pytest

from protocol.block_keys import BlockKey
from worker.hot_tier import HotTier


def key(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(16, "big"))


def test_longest_run_stops_at_first_missing_block() -> None:
    cache = HotTier(1000)
    for i in (0, 1, 3):
        cache.put(key(i), f"p{i}", 10)
    assert cache.longest_run([key(0), key(1), key(2), key(3)]) == ["p0", "p1"]
    assert cache.stats.hits == 2 and cache.stats.misses == 1


@pytest.mark.parametrize("budget, sizes, survivors", [
    (30, [10, 10, 10, 10], [1, 2, 3]),
    (25, [10, 10, 10], [1, 2]),
    (100, [60, 50], [1]),
    (10, [11], []),
])
def test_lru_eviction_by_bytes(budget, sizes, survivors) -> None:
    cache = HotTier(budget)
    for i, size in enumerate(sizes):
        cache.put(key(i), i, size)
    assert [i for i in range(len(sizes)) if key(i) in cache] == survivors
    assert cache.used_bytes <= budget


def test_lookup_refreshes_recency() -> None:
    cache = HotTier(30)
    for i in range(3):
        cache.put(key(i), i, 10)
    cache.longest_run([key(0)])
    cache.put(key(3), 3, 10)
    assert key(0) in cache and key(1) not in cache


def test_a_prefix_loses_its_last_blocks_first() -> None:
    """A hit on a chain leaves its head the newest: new traffic evicts the chain from its
    end, so what survives is still a usable prefix (plain LRU evicted block 0 first and
    with it every block behind it)."""
    cache = HotTier(40)
    chain = [key(i) for i in range(4)]
    for i, k in enumerate(chain):
        cache.put(k, i, 10)
    assert cache.longest_run(chain) == [0, 1, 2, 3]
    cache.put(key(10), "other", 10)
    cache.put(key(11), "other", 10)
    assert [k in cache for k in chain] == [True, True, False, False]
    assert cache.longest_run(chain) == [0, 1]


def test_refresh_keeps_a_chain_head_newest() -> None:
    cache = HotTier(30)
    for i in range(3):
        cache.put(key(i), i, 10)
    cache.refresh([key(0), key(1), key(2)])
    cache.put(key(5), 5, 10)
    assert key(0) in cache and key(1) in cache and key(2) not in cache


def test_shared_block_is_stored_once() -> None:
    cache = HotTier(100)
    assert cache.put(key(1), "a", 40)
    assert cache.put(key(1), "a-again", 40)
    assert cache.used_bytes == 40 and len(cache) == 1
    assert cache.longest_run([key(1)]) == ["a"]


def test_budget_holds_under_churn() -> None:
    rng = random.Random(0)
    cache = HotTier(10_000)
    sizes: dict[int, int] = {}
    for step in range(5000):
        i = rng.randrange(2000)
        size = sizes.setdefault(i, rng.randrange(1, 3000))
        cache.put(key(i), i, size)
        if step % 7 == 0:
            cache.longest_run([key(rng.randrange(2000)) for _ in range(3)])
        assert cache.used_bytes <= cache.budget_bytes
    stored = [i for i in sizes if key(i) in cache]
    assert cache.used_bytes == sum(sizes[i] for i in stored)


def test_clear_drops_every_block_but_not_what_a_reader_holds() -> None:
    cache = HotTier(100)
    for i in range(3):
        cache.put(key(i), [i], 20)
    held = cache.longest_run([key(0), key(1)])
    assert cache.clear() == (3, 60)
    assert len(cache) == 0 and cache.used_bytes == 0 and key(0) not in cache
    assert held == [[0], [1]]  # a running request's payloads are its own
    assert cache.longest_run([key(0)]) == [] and cache.stats.hits == 2  # counters go on
    assert cache.put(key(5), [5], 100) and cache.used_bytes == 100  # the whole budget again
    assert cache.clear() == (1, 100) and cache.clear() == (0, 0)


def test_pinned_blocks_are_never_evicted_and_count_against_the_budget() -> None:
    cache = HotTier(40)
    cache.pin([key(0), key(9)])  # key 9 is pinned before it arrives
    for i in range(3):
        cache.put(key(i), i, 10)
    assert cache.pinned_bytes == 10 and cache.pinned_blocks == 1
    for i in range(3, 8):  # churn: everything else goes, the pinned block stays
        assert cache.put(key(i), i, 10)
    assert key(0) in cache and [i for i in range(1, 8) if key(i) in cache] == [5, 6, 7]
    assert cache.put(key(9), 9, 10) and cache.pinned_bytes == 20 and cache.used_bytes == 40
    assert not cache.put(key(10), 10, 25)  # only 20 bytes are not pinned: it cannot fit...
    assert [i for i in range(8) if key(i) in cache] == [0, 6, 7]  # ...and nothing was evicted for it
    assert cache.clear() == (2, 20) and key(0) in cache and key(9) in cache  # a clear keeps pins
    assert cache.used_bytes == 20


def test_unpinned_blocks_are_evictable_again_and_pins_are_counted_per_snapshot() -> None:
    cache = HotTier(30)
    cache.pin([key(0)])
    cache.pin([key(0)])  # two snapshots share the block
    cache.put(key(0), 0, 10)
    cache.put(key(1), 1, 10)
    cache.unpin([key(0)])
    assert cache.is_pinned(key(0)) and cache.pinned_bytes == 10
    cache.unpin([key(0)])
    assert not cache.is_pinned(key(0)) and cache.pinned_bytes == 0
    cache.put(key(2), 2, 10)
    cache.put(key(3), 3, 10)  # the oldest, key 0, goes first now
    assert key(0) not in cache and key(1) in cache


def test_a_peek_changes_no_recency_and_counts_nothing() -> None:
    cache = HotTier(20)
    cache.put(key(0), "a", 10)
    cache.put(key(1), "b", 10)
    assert cache.peek(key(0)) == "a" and cache.nbytes(key(0)) == 10 and cache.peek(key(5)) is None
    cache.put(key(2), "c", 10)
    assert key(0) not in cache and key(1) in cache  # a lookup would have kept key 0
    assert (cache.stats.hits, cache.stats.misses) == (0, 0)
