"""Named snapshots in the kvstore: pinned blocks are never evicted, count against the cap,
survive reopening, and go back into the LRU order by their last use when unpinned; a
probe looks without touching the LRU order."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvstore.eviction import LRUOrder
from kvstore.store import KVStore
from protocol.messages import (
    KVFlush,
    KVPin,
    KVPinResult,
    KVProbe,
    KVProbeResult,
    KVSnapshots,
    KVSnapshotsResult,
    KVStats,
    KVUnpin,
    KVUnpinResult,
)
from tests.kvstore.helpers import KVClient, KVProcess, key

BLOCK = 16 << 10  # random bytes: lz4 leaves them as they are
CAP = 1 << 20
SEGMENT = 64 << 10


def _store(root: Path) -> KVStore:
    return KVStore(root, max_disk_bytes=CAP, segment_bytes=SEGMENT)


def _fill(store: KVStore, namespace: str, keys: list[bytes]) -> None:
    for k in keys:
        assert store.put(namespace, k, os.urandom(BLOCK))


def _churn(store: KVStore, n: int, salt: str) -> None:
    """Twice the cap of other blocks, so everything evictable goes."""
    _fill(store, "m", [key(i, salt) for i in range(n)])


def test_lru_order_skips_pinned_slots_and_puts_them_back_by_last_use() -> None:
    order = LRUOrder()
    for slot in range(4):
        order.add(slot, 1, slot + 1)
    order.pin(0, 1)
    order.pin(2, 1)
    assert order.oldest() == 1 and order.slots(1) == [1, 3] and len(order) == 4
    order.touch(0, 1, 10)  # a pinned block read: its last use moves on, it stays pinned
    assert order.oldest() == 1 and order.is_pinned(0)
    order.unpin([0, 2])
    assert order.slots(1) == [1, 2, 3, 0]  # 2 kept its last use (3), 0 took the read's (10)
    order.remove(3, 1)
    order.pin(1, 1)
    order.remove(1, 1)  # a pinned slot that is dropped leaves the pinned set too
    assert order.pinned() == [] and order.oldest() == 2


def test_pinned_blocks_survive_eviction_that_takes_everything_else(tmp_path: Path) -> None:
    pinned = [key(i, "snap") for i in range(4)]
    with _store(tmp_path / "store") as store:
        _fill(store, "m", pinned[:2])  # two stored before the pin, two after
        others = [key(i, "old") for i in range(4)]
        _fill(store, "m", others)
        snapshot = store.pin("s1", "m", pinned, {"tokens": 1024})
        assert snapshot is not None and (snapshot["blocks"], snapshot["stored_blocks"]) == (4, 2)
        assert store.pin("s1", "m", pinned, {}) is None  # the name is taken
        _fill(store, "m", pinned[2:])
        _churn(store, 2 * CAP // BLOCK, "churn")
        assert store.probe("m", pinned) == [True] * 4
        assert store.probe("m", others) == [False] * 4
        stats = store.stats()
        assert stats["evictions"] > 0 and stats["disk_bytes"] <= CAP
        assert stats["pinned_blocks"] == 4 and stats["pinned_bytes"] >= 4 * BLOCK
        assert stats["namespaces"]["m"]["pinned_blocks"] == 4
        (listed,) = store.snapshots()
        assert listed["name"] == "s1" and listed["stored_blocks"] == 4 and listed["info"] == {"tokens": 1024}
        assert listed["bytes"] == stats["pinned_bytes"]
        assert store.snapshots("other-namespace") == []


def test_pins_survive_reopening_and_unpinned_blocks_are_evictable_again(tmp_path: Path) -> None:
    root = tmp_path / "store"
    pinned = [key(i, "snap") for i in range(3)]
    with _store(root) as store:
        _fill(store, "m", pinned)
        store.pin("s1", "m", pinned, {})
    assert json.loads((root / "pins.json").read_text())["snapshots"]["s1"]["keys"] == [k.hex() for k in pinned]
    with _store(root) as store:
        _churn(store, 2 * CAP // BLOCK, "one")
        assert store.probe("m", pinned) == [True] * 3
        assert store.unpin("s1")["name"] == "s1"
        assert store.unpin("s1") is None
        assert store.stats()["pinned_blocks"] == 0
        _churn(store, 2 * CAP // BLOCK, "two")
        assert store.probe("m", pinned) == [False] * 3
    with _store(root) as store:
        assert store.snapshots() == []


def test_two_snapshots_sharing_blocks_keep_them_until_both_are_gone(tmp_path: Path) -> None:
    shared, own = [key(0, "shared")], [key(1, "own")]
    with _store(tmp_path / "store") as store:
        _fill(store, "m", shared + own)
        store.pin("a", "m", shared + own, {})
        store.pin("b", "m", shared, {})
        store.unpin("a")
        _churn(store, 2 * CAP // BLOCK, "x")
        assert store.probe("m", shared + own) == [True, False]


def test_a_clear_keeps_pinned_blocks(tmp_path: Path) -> None:
    pinned = [key(i, "snap") for i in range(2)]
    with _store(tmp_path / "store") as store:
        _fill(store, "m", pinned + [key(9)])
        _fill(store, "other", [key(9)])
        store.pin("s", "m", pinned, {})
        assert store.clear("m") == 1
        assert store.clear() == 1  # everything: the other namespace's block, not the pins
        assert store.probe("m", pinned) == [True, True]
        assert store.probe("other", [key(9)]) == [False]


def test_a_probe_neither_touches_nor_counts(tmp_path: Path) -> None:
    """The LRU order and every last use stay as they were; a lookup (the negative
    control) moves the block it found to the young end."""
    with _store(tmp_path / "store") as store:
        first, second = key(0, "first"), key(1, "second")
        _fill(store, "m", [first, second])

        def order() -> list[tuple[int, int]]:
            namespace_id = store._namespaces.find("m")
            return [(slot, store._index.record(slot).last_use) for slot in store._lru.slots(namespace_id)]

        before, counted = order(), store.stats()
        assert store.probe("m", [first, key(5), second]) == [True, False, True]
        assert store.probe("nope", [first]) == [False]
        assert order() == before
        after = store.stats()
        assert (after["hits"], after["misses"]) == (counted["hits"], counted["misses"])
        store.lookup("m", [first])
        assert [slot for slot, _ in order()] == [slot for slot, _ in reversed(before)]


def test_the_process_pins_probes_lists_and_unpins(kv_process: KVProcess, kv_client: KVClient) -> None:
    process, client = kv_process.start(), kv_client
    keys = [key(i, "p") for i in range(3)]
    client.put("m", [(k, os.urandom(4096)) for k in keys[:2]])
    answer, _ = client.ask(KVPin(client.next_id(), "snap", "m", keys, {"model": "m", "tokens": 768}))
    assert isinstance(answer, KVPinResult) and answer.error == ""
    assert answer.snapshot["stored_blocks"] == 2  # the puts before it are done first
    answer, _ = client.ask(KVPin(client.next_id(), "snap", "m", keys, {}))
    assert answer.error == "exists"
    answer, _ = client.ask(KVProbe(client.next_id(), "m", keys))
    assert isinstance(answer, KVProbeResult) and answer.found == [True, True, False]
    client.ask(KVFlush(client.next_id()))
    process.stop()
    process.start()  # killed, restarted: the pin set was on disk before the answer
    answer, _ = client.ask(KVSnapshots(client.next_id(), "m"))
    assert isinstance(answer, KVSnapshotsResult)
    (snapshot,) = answer.snapshots
    assert snapshot["keys"] == keys and snapshot["info"]["tokens"] == 768 and snapshot["blocks"] == 3
    stats, _ = client.ask(KVStats(client.next_id()))
    assert stats.stats["pinned_blocks"] == 2 and stats.stats["num_snapshots"] == 1
    answer, _ = client.ask(KVUnpin(client.next_id(), "snap"))
    assert isinstance(answer, KVUnpinResult) and answer.snapshot["name"] == "snap"
    answer, _ = client.ask(KVUnpin(client.next_id(), "snap"))
    assert answer.snapshot is None and answer.error == ""
