"""The mmapped index: slots persist, damage is dropped, a lost index is rebuilt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvstore.index import (
    HEADER_BYTES,
    SLOT_BYTES,
    IndexDamaged,
    IndexRecord,
    IndexTable,
)
from kvstore.store import KVStore
from tests.kvstore.helpers import key, payload


def _record(i: int, namespace_id: int = 1) -> IndexRecord:
    return IndexRecord(key(i), namespace_id, segment=1 + i % 3, offset=100 * i, length=50 + i, last_use=i)


def _contents(table: IndexTable) -> dict[tuple[int, bytes], IndexRecord]:
    return {(r.namespace_id, r.key): r for _, r in table.live()}


def test_slots_persist_across_reopen_and_growth(tmp_path: Path) -> None:
    path = tmp_path / "index.bin"
    table = IndexTable.create(path, capacity=4)
    slots = [table.insert(_record(i)) for i in range(10)]  # grows 4 -> 8 -> 16
    table.remove(slots[3])
    table.touch(slots[4], 99)
    expected = _contents(table)
    assert table.capacity == 16 and len(table) == 9
    table.close(clean=True)
    assert path.stat().st_size == HEADER_BYTES + 16 * SLOT_BYTES

    reopened, num_bad = IndexTable.load(path)
    assert num_bad == 0 and reopened.was_clean
    assert _contents(reopened) == expected
    assert reopened.record(slots[4]).last_use == 99
    assert reopened.find(1, key(3)) is None
    assert reopened.insert(_record(3)) == slots[3]  # a freed slot is reused
    reopened.close(clean=False)
    assert not IndexTable.load(path)[0].was_clean


def test_a_damaged_slot_is_dropped_on_load(tmp_path: Path) -> None:
    path = tmp_path / "index.bin"
    table = IndexTable.create(path)
    slots = [table.insert(_record(i)) for i in range(3)]
    table.close(clean=True)
    with open(path, "r+b") as file:
        file.seek(HEADER_BYTES + slots[1] * SLOT_BYTES + 30)  # inside the offset field
        file.write(b"\x7f")
    table, num_bad = IndexTable.load(path)
    assert num_bad == 1
    assert set(_contents(table)) == {(1, key(0)), (1, key(2))}


def test_a_slot_that_looks_empty_makes_the_index_damaged(tmp_path: Path) -> None:
    """Zeros over a live slot's state byte leave no CRC to fail (an empty slot is all
    zeros): the header's count gives it away, and the index is rebuilt from the segments
    instead of losing that block without a word (the file fuzzer found this)."""
    path = tmp_path / "index.bin"
    table = IndexTable.create(path)
    slots = [table.insert(_record(i)) for i in range(3)]
    table.close(clean=True)
    with open(path, "r+b") as file:
        file.seek(HEADER_BYTES + slots[1] * SLOT_BYTES + 16)  # from the state byte on
        file.write(bytes(8))
    with pytest.raises(IndexDamaged, match="3 entries in its header, 2 in its slots"):
        IndexTable.load(path)


@pytest.mark.parametrize(
    "damage",
    ["empty", "garbage", "short", "header-crc", "wrong-size"],
)
def test_an_unusable_file_is_reported_damaged(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "index.bin"
    IndexTable.create(path, capacity=8).close(clean=True)
    data = bytearray(path.read_bytes())
    if damage == "empty":
        data = bytearray()
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "short":
        data = data[:40]
    elif damage == "header-crc":
        data[24] ^= 1  # capacity
    else:
        data += bytes(SLOT_BYTES)
    path.write_bytes(bytes(data))
    with pytest.raises(IndexDamaged):
        IndexTable.load(path)


# ---------------------------------------------------------------- open / verify / rebuild, via the store


def _make_store(root: Path) -> KVStore:
    return KVStore(root, max_disk_bytes=8 << 20, segment_bytes=64 << 10)


def _fill(root: Path) -> dict[tuple[str, bytes], bytes]:
    blocks = {(ns, key(i)): payload(i + 100 * n) for n, ns in enumerate(["a", "b"]) for i in range(40)}
    with _make_store(root) as store:
        for (ns, k), data in blocks.items():
            assert store.put(ns, k, data)
        store.get("a", [key(0)])  # a hit moves key 0 of "a" to most recently used
    return blocks


@pytest.mark.parametrize(
    "damage",
    ["index-missing", "index-garbage", "index-truncated", "namespaces-missing", "namespaces-garbage"],
)
def test_a_lost_or_damaged_index_is_rebuilt_with_the_same_contents(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "store"
    blocks = _fill(root)
    index = root / "index.bin"
    if damage == "index-missing":
        index.unlink()
    elif damage == "index-garbage":
        index.write_bytes(os.urandom(index.stat().st_size))
    elif damage == "index-truncated":
        os.truncate(index, index.stat().st_size - 7)
    elif damage == "namespaces-missing":
        (root / "namespaces.json").unlink()
    else:
        (root / "namespaces.json").write_text("{not json")
    with _make_store(root) as store:
        assert store.open_report.rebuilt
        assert store.stats()["num_blocks"] == len(blocks)
        for (ns, k), data in blocks.items():
            assert store.get(ns, [k]) == [data]
    assert json.loads((root / "namespaces.json").read_text())["namespaces"].keys() == {"a", "b"}


def test_an_intact_index_is_verified_not_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "store"
    blocks = _fill(root)
    with _make_store(root) as store:
        assert not store.open_report.rebuilt and store.open_report.num_dropped == 0
        assert store.lookup("a", [k for (ns, k) in blocks if ns == "a"]) == 40


def test_entries_pointing_at_a_lost_segment_are_dropped(tmp_path: Path) -> None:
    root = tmp_path / "store"
    blocks = _fill(root)
    segments = sorted((root / "segments").iterdir())
    assert len(segments) > 2
    segments[0].unlink()
    with _make_store(root) as store:
        dropped = store.open_report.num_dropped
        assert dropped > 0 and not store.open_report.rebuilt
        found = {(ns, k) for (ns, k) in blocks if store.get(ns, [k]) == [blocks[(ns, k)]]}
        assert len(found) == len(blocks) - dropped
