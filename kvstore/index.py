"""The on-disk index: a memory-mapped table of fixed-size slots, and its recovery.

`index.bin` is a 64-byte header and `capacity` slots of 48 bytes. The table is the only
index: the in-memory map (namespace id, key) -> slot and the free list are derived from it
at open. Opening verifies every live slot against the record it points at, and rebuilds
the table by scanning the segments when the file is missing or damaged.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from kvstore.namespaces import NamespaceTable
from kvstore.segments import CorruptRecord, read_header, scan_segment
from protocol.atomic_files import atomic_replace

log = logging.getLogger(__name__)

INDEX_MAGIC = b"MLXDKVIX"
INDEX_VERSION = 1
# magic, version, slot size, capacity, live count, generation (opens), clean flag, CRC32
HEADER = struct.Struct("<8sIIQQQII")
HEADER_BYTES = 64
# key, namespace id, state, reserved, segment, offset, record length, last use, CRC32
SLOT = struct.Struct("<16sHBBIQIQI")
SLOT_BYTES = SLOT.size
EMPTY, LIVE, DEAD = 0, 1, 2  # DEAD: evicted or dropped; free for reuse like EMPTY
INITIAL_CAPACITY = 1024


class IndexDamaged(Exception):
    """index.bin cannot be used as is; the caller rebuilds it from the segments."""


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """Where one block lives: `length` bytes (the whole record) at `offset` of `segment`;
    `last_use` is a logical clock, larger = more recently used."""

    key: bytes
    namespace_id: int
    segment: int
    offset: int
    length: int
    last_use: int


def _pack_slot(state: int, record: IndexRecord) -> bytes:
    fields = SLOT.pack(
        record.key, record.namespace_id, state, 0, record.segment, record.offset, record.length, record.last_use, 0
    )[:-4]
    return fields + struct.pack("<I", zlib.crc32(fields))


class IndexTable:
    """Slots in a memory-mapped file; a slot is LIVE or free.

    Invariants: a slot is LIVE exactly when it is in the key map; the free list holds
    every other slot; the header's count equals the number of LIVE slots after each call.
    Writes land in the page cache (they survive a SIGKILL); `sync` makes them durable.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "r+b")
        self._mm = mmap.mmap(self._file.fileno(), 0)
        fields = HEADER.unpack_from(self._mm, 0)
        self.capacity, self.generation, self.was_clean = fields[3], fields[5], bool(fields[6])
        self._slots: dict[tuple[int, bytes], int] = {}
        self._free: list[int] = []

    # ------------------------------------------------------------ open

    @classmethod
    def create(cls, path: Path, capacity: int = INITIAL_CAPACITY, generation: int = 0) -> IndexTable:
        """An empty table replacing whatever is at `path`."""
        with atomic_replace(path) as temp, open(temp, "wb") as file:
            file.write(_pack_header(capacity, 0, generation, clean=True))
            file.truncate(HEADER_BYTES + capacity * SLOT_BYTES)  # zeros: every slot EMPTY
        table = cls(path)
        table._free = list(range(capacity - 1, -1, -1))
        return table

    @classmethod
    def load(cls, path: Path) -> tuple[IndexTable, int]:
        """The table at `path` and how many damaged slots were dropped. Raises
        `FileNotFoundError` or `IndexDamaged` when the file cannot be used at all."""
        size = path.stat().st_size
        if size < HEADER_BYTES:
            raise IndexDamaged("shorter than its header")
        with open(path, "rb") as file:
            head = file.read(HEADER_BYTES)
        magic, version, slot_bytes, capacity, count, _gen, _clean, crc = HEADER.unpack_from(head, 0)
        if magic != INDEX_MAGIC or version != INDEX_VERSION or slot_bytes != SLOT_BYTES:
            raise IndexDamaged("bad magic, version or slot size")
        if zlib.crc32(head[: HEADER.size - 4]) != crc:
            raise IndexDamaged("header CRC mismatch")
        if size != HEADER_BYTES + capacity * SLOT_BYTES:
            raise IndexDamaged(f"{size} bytes for {capacity} slots")
        table = cls(path)
        num_bad = table._load_slots()
        if len(table) + num_bad < count:
            # slots whose state byte was overwritten look empty: their entries vanished
            # without a CRC to catch it, but their blocks are still in the segments
            table.close(clean=False)
            raise IndexDamaged(f"{count} entries in its header, {len(table) + num_bad} in its slots")
        return table, num_bad

    def _load_slots(self) -> int:
        num_bad = 0
        for slot in range(self.capacity - 1, -1, -1):
            position = HEADER_BYTES + slot * SLOT_BYTES
            state = self._mm[position + 18]
            if state != LIVE:
                self._free.append(slot)
                continue
            if zlib.crc32(self._mm[position : position + SLOT_BYTES - 4]) != struct.unpack_from(
                "<I", self._mm, position + SLOT_BYTES - 4
            )[0]:
                num_bad += 1
                self._mm[position : position + SLOT_BYTES] = bytes(SLOT_BYTES)
                self._free.append(slot)
                continue
            record = self.record(slot)
            other = self._slots.get((record.namespace_id, record.key))
            if other is not None:  # should not happen; keep the more recently used
                num_bad += 1
                loser = slot if self.record(other).last_use >= record.last_use else other
                if loser == other:
                    self._slots[(record.namespace_id, record.key)] = slot
                self._mm[HEADER_BYTES + loser * SLOT_BYTES : HEADER_BYTES + (loser + 1) * SLOT_BYTES] = bytes(SLOT_BYTES)
                self._free.append(loser)
                continue
            self._slots[(record.namespace_id, record.key)] = slot
        self._free.sort(reverse=True)  # lowest slots are reused first
        self._write_header(clean=self.was_clean)
        return num_bad

    def mark_open(self) -> None:
        """A new generation, not closed cleanly until `close(clean=True)`."""
        self.generation += 1
        self._write_header(clean=False)
        self._mm.flush(0, mmap.PAGESIZE)

    # ------------------------------------------------------------ slots

    def __len__(self) -> int:
        return len(self._slots)

    def find(self, namespace_id: int, key: bytes) -> int | None:
        return self._slots.get((namespace_id, key))

    def record(self, slot: int) -> IndexRecord:
        key, namespace_id, _state, _reserved, segment, offset, length, last_use, _crc = SLOT.unpack_from(
            self._mm, HEADER_BYTES + slot * SLOT_BYTES
        )
        return IndexRecord(key, namespace_id, segment, offset, length, last_use)

    def live(self) -> Iterator[tuple[int, IndexRecord]]:
        for slot in sorted(self._slots.values()):
            yield slot, self.record(slot)

    def insert(self, record: IndexRecord) -> int:
        if not self._free:
            self.grow()
        slot = self._free.pop()
        self._put(slot, LIVE, record)
        self._slots[(record.namespace_id, record.key)] = slot
        self._write_header(clean=False)
        return slot

    def update(self, slot: int, record: IndexRecord) -> None:
        self._put(slot, LIVE, record)

    def touch(self, slot: int, last_use: int) -> None:
        self._put(slot, LIVE, replace(self.record(slot), last_use=last_use))

    def remove(self, slot: int) -> IndexRecord:
        record = self.record(slot)
        del self._slots[(record.namespace_id, record.key)]
        self._put(slot, DEAD, record)
        self._free.append(slot)
        self._write_header(clean=False)
        return record

    def _put(self, slot: int, state: int, record: IndexRecord) -> None:
        position = HEADER_BYTES + slot * SLOT_BYTES
        self._mm[position : position + SLOT_BYTES] = _pack_slot(state, record)  # one copy

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def grow(self) -> None:
        """Rebuild into a file with twice the slots; slot numbers stay the same."""
        new_capacity = self.capacity * 2
        with atomic_replace(self.path) as temp, open(temp, "wb") as file:
            file.write(_pack_header(new_capacity, len(self._slots), self.generation, clean=False))
            file.write(self._mm[HEADER_BYTES:])
            file.truncate(HEADER_BYTES + new_capacity * SLOT_BYTES)
        self._mm.close()
        self._file.close()
        self._file = open(self.path, "r+b")
        self._mm = mmap.mmap(self._file.fileno(), 0)
        self._free = list(range(new_capacity - 1, self.capacity - 1, -1)) + self._free
        self.capacity = new_capacity
        log.info("index grown to %d slots", new_capacity)

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.capacity * SLOT_BYTES

    # ------------------------------------------------------------ durability

    def _write_header(self, clean: bool) -> None:
        self._mm[:HEADER_BYTES] = _pack_header(self.capacity, len(self._slots), self.generation, clean)

    def sync(self) -> None:
        self._mm.flush()

    def close(self, clean: bool) -> None:
        self._write_header(clean=clean)
        self._mm.flush()
        self._mm.close()
        self._file.close()


def _pack_header(capacity: int, count: int, generation: int, clean: bool) -> bytes:
    fields = HEADER.pack(INDEX_MAGIC, INDEX_VERSION, SLOT_BYTES, capacity, count, generation, int(clean), 0)[:-4]
    header = fields + struct.pack("<I", zlib.crc32(fields))
    return header + bytes(HEADER_BYTES - len(header))


# ---------------------------------------------------------------- verify / rebuild


@dataclass
class OpenReport:
    rebuilt: bool
    reason: str  # why it was rebuilt ("" if not)
    num_dropped: int  # live slots that failed verification
    num_blocks: int  # live slots after open


def verify_index(table: IndexTable, namespaces: NamespaceTable, segments: dict[int, Path]) -> int:
    """Drop every live slot that does not point at an intact record header with the same
    key, namespace and length inside an existing segment; returns how many were dropped."""
    fds: dict[int, tuple[int, int]] = {}
    num_dropped = 0
    try:
        for slot, record in list(table.live()):
            name = namespaces.name_of(record.namespace_id)
            path = segments.get(record.segment)
            intact = False
            if name is not None and path is not None:
                if record.segment not in fds:
                    fd = os.open(path, os.O_RDONLY)
                    fds[record.segment] = (fd, os.fstat(fd).st_size)
                fd, size = fds[record.segment]
                if record.offset + record.length <= size:
                    try:
                        header = read_header(fd, record.offset)
                        intact = (header.key, header.namespace, header.record_bytes) == (
                            record.key, name, record.length
                        )
                    except (CorruptRecord, OSError, struct.error):
                        intact = False
            if not intact:
                table.remove(slot)
                num_dropped += 1
    finally:
        for fd, _ in fds.values():
            os.close(fd)
    return num_dropped


def rebuild_index(path: Path, namespaces_path: Path, segments: dict[int, Path]) -> tuple[IndexTable, NamespaceTable]:
    """A new index (and namespace table) from a scan of every segment. The latest copy
    of a key wins; scan order stands in for last use. Torn tails are cut off."""
    namespaces = NamespaceTable.fresh(namespaces_path)
    latest: dict[tuple[str, bytes], tuple[int, int, int]] = {}
    for number, segment in segments.items():
        result = scan_segment(segment, verify_payload=False, truncate=True)
        if result.num_skipped:
            log.warning("%s: skipped %d damaged records", segment.name, result.num_skipped)
        for offset, header in result.records:
            latest[(header.namespace, header.key)] = (number, offset, header.record_bytes)
    capacity = INITIAL_CAPACITY
    while capacity < 2 * len(latest):
        capacity *= 2
    table = IndexTable.create(path, capacity)
    ordered = sorted(latest.items(), key=lambda item: item[1][:2])
    for clock, ((name, key), (segment, offset, length)) in enumerate(ordered, start=1):
        table.insert(IndexRecord(key, namespaces.id_of(name), segment, offset, length, clock))
    return table, namespaces


def open_index(path: Path, namespaces: NamespaceTable, segments: dict[int, Path]) -> tuple[IndexTable, NamespaceTable, OpenReport]:
    """Load and verify the index, or rebuild it from the segments if it cannot be used."""
    reason = ""
    table: IndexTable | None = None
    num_bad = 0
    try:
        table, num_bad = IndexTable.load(path)
    except FileNotFoundError:
        reason = "index.bin is missing"
    except IndexDamaged as exc:
        reason = f"index.bin is damaged ({exc})"
    if table is not None and namespaces.damaged and len(table):
        reason = "namespaces.json is missing or damaged"
        table.close(clean=False)
        table = None
    if table is None and not segments and not path.exists():  # a new store
        table, namespaces = rebuild_index(path, namespaces.path, segments)
        return table, namespaces, OpenReport(False, "", 0, 0)
    if table is None:
        log.warning("%s: rebuilding it from %d segments", reason, len(segments))
        table, namespaces = rebuild_index(path, namespaces.path, segments)
        return table, namespaces, OpenReport(True, reason, 0, len(table))
    num_dropped = num_bad + verify_index(table, namespaces, segments)
    if num_dropped:
        log.warning("index: dropped %d entries that no longer match their segment records", num_dropped)
    return table, namespaces, OpenReport(False, "", num_dropped, len(table))
