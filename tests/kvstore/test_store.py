"""KVStore semantics: runs, namespaces, caps, damage, persistence, and churn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvstore.segments import scan_segment
from kvstore.store import KVStore
from tests.kvstore.helpers import disk_bytes, key, num_segment_files, payload

CAP = 2 << 20
SEGMENT = 256 << 10


def _store(root: Path, **kwargs) -> KVStore:
    settings = {"max_disk_bytes": CAP, "segment_bytes": SEGMENT, **kwargs}
    return KVStore(root, **settings)


@pytest.fixture
def store(tmp_path: Path):
    with _store(tmp_path / "store") as s:
        yield s


@pytest.mark.parametrize(
    "stored, asked, num_found",
    [
        ([0, 1, 2, 4], [0, 1, 2, 3, 4], 3),
        ([0, 1, 2, 4], [0, 1, 2, 4], 4),
        ([0, 1, 2, 4], [3, 0, 1], 0),
        ([0, 1, 2, 4], [], 0),
        ([], [0], 0),
    ],
)
def test_lookup_counts_the_run_from_the_first_key(store: KVStore, stored, asked, num_found) -> None:
    for i in stored:
        store.put("m", key(i), payload(i))
    assert store.lookup("m", [key(i) for i in asked]) == num_found


def test_get_returns_each_found_payload_exactly(store: KVStore) -> None:
    for i in (0, 2):
        store.put("m", key(i), payload(i))
    store.put("m", key(5), b"")
    assert store.get("m", [key(0), key(1), key(2), key(5)]) == [payload(0), None, payload(2), b""]
    assert store.get("unknown", [key(0)]) == [None]
    stats = store.stats()
    assert (stats["hits"], stats["misses"]) == (3, 2)
    assert stats["namespaces"]["m"]["hits"] == 3


def test_namespaces_are_separate(store: KVStore) -> None:
    store.put("a", key(0), b"from a")
    store.put("b", key(0), b"from b")
    store.put("b", key(1), b"b only")
    assert store.get("a", [key(0), key(1)]) == [b"from a", None]
    assert store.get("b", [key(0)]) == [b"from b"]
    assert store.clear("a") == 1
    assert store.get("a", [key(0)]) == [None]
    assert store.get("b", [key(0), key(1)]) == [b"from b", b"b only"]
    assert store.clear("nope") == 0
    assert store.clear() == 2
    assert store.stats()["num_blocks"] == 0
    store.put("a", key(0), b"again")  # still usable after clearing everything
    assert store.get("a", [key(0)]) == [b"again"]


def test_a_duplicate_put_only_refreshes_last_use(store: KVStore) -> None:
    store.put("m", key(0), payload(0))
    assert store.put("m", key(0), b"different bytes are ignored")
    assert store.get("m", [key(0)]) == [payload(0)]
    stats = store.stats()
    assert (stats["puts"], stats["duplicates"], stats["num_blocks"]) == (1, 1, 1)


def test_a_namespace_cap_evicts_its_own_oldest_blocks(tmp_path: Path) -> None:
    block = 8192  # random bytes: stored as is, so each record is a little over 8 KiB
    with _store(tmp_path / "store", namespace_caps={"small": 5 * block + 500}) as store:
        store.put("other", key(0), os.urandom(block))
        for i in range(10):
            store.put("small", key(i), os.urandom(block))
            store.lookup("small", [key(0)])  # key 0 stays the most recently used
        stats = store.stats()["namespaces"]
        assert stats["small"]["bytes"] <= 5 * block + 500
        assert stats["small"]["blocks"] == 5
        assert store.lookup("small", [key(0)]) == 1
        assert [store.lookup("small", [key(i)]) for i in range(6, 10)] == [1] * 4
        assert store.lookup("other", [key(0)]) == 1
        assert not store.put("small", key(99), os.urandom(6 * block))  # bigger than its cap
        assert store.stats()["dropped"] == 1


def test_a_damaged_payload_is_a_miss_and_leaves_the_index(store: KVStore) -> None:
    for i in range(3):
        store.put("m", key(i), payload(i, 20_000))
    store.flush()
    segment = next((store.root / "segments").iterdir())
    offset, header = scan_segment(segment, verify_payload=True, truncate=False).records[1]
    with open(segment, "r+b") as file:
        file.seek(offset + header.payload_offset + 100)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    assert store.get("m", [key(0), key(1), key(2)]) == [payload(0, 20_000), None, payload(2, 20_000)]
    assert store.lookup("m", [key(0), key(1), key(2)]) == 1
    assert store.stats()["corrupt"] == 1


@pytest.mark.parametrize("closed", [True, False], ids=["clean-close", "no-close"])
def test_blocks_survive_reopening(tmp_path: Path, closed: bool) -> None:
    root = tmp_path / "store"
    first = _store(root)
    for i in range(50):
        first.put("m", key(i), payload(i))
    if closed:
        first.close()
    second = _store(root)  # without close: what a SIGKILL leaves (the page cache has it all)
    assert second.get("m", [key(i) for i in range(50)]) == [payload(i) for i in range(50)]
    assert not second.open_report.rebuilt
    second.close()
    if not closed:
        first.close()


def test_a_lowered_cap_is_enforced_on_open(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with _store(root, max_disk_bytes=8 << 20) as store:
        for i in range(600):
            store.put("m", key(i), os.urandom(8192))
    assert disk_bytes(root) > CAP
    with _store(root) as store:
        assert store.disk_bytes <= CAP
    assert disk_bytes(root) <= CAP + SEGMENT


def test_churn_stays_within_the_cap_and_keeps_recently_used_blocks(tmp_path: Path) -> None:
    """10x the cap passes through: disk use and segment count stay bounded, and the blocks
    in use survive older ones (compaction carries them out of dying segments)."""
    root = tmp_path / "store"
    block = 16 << 10
    hot = [key(i, "hot") for i in range(8)]
    max_segments = CAP // SEGMENT + 2
    with _store(root) as store:
        for i, k in enumerate(hot):
            store.put("m", k, payload(i, block))
        num_puts = 10 * CAP // (block // 2)  # payloads compress to about half
        for i in range(num_puts):
            store.put("m", key(i), payload(i, block))
            assert store.lookup("m", hot) == len(hot)
            if i % 25 == 0:
                assert disk_bytes(root) <= CAP + SEGMENT
                assert num_segment_files(root) <= max_segments
        stats = store.stats()
        assert stats["puts"] == num_puts + len(hot)
        assert stats["evictions"] > num_puts // 2
        assert stats["compactions"] > 0
        assert stats["disk_bytes"] == disk_bytes(root) <= CAP
        assert store.get("m", hot) == [payload(i, block) for i in range(len(hot))]
        recent = [key(i) for i in range(num_puts - 20, num_puts)]
        assert store.get("m", recent) == [payload(i, block) for i in range(num_puts - 20, num_puts)]
        assert store.lookup("m", [key(0)]) == 0
    with _store(root) as store:  # and it all reopens as it was
        assert store.stats()["num_blocks"] == stats["num_blocks"]
        assert store.get("m", hot) == [payload(i, block) for i in range(len(hot))]
