"""Room on disk for a `KVStore`: appending records to segment files, and keeping the
bytes under the caps by evicting least recently used blocks (never those a snapshot pins:
they count against the caps all the same), compacting segments whose records are mostly
dead, and deleting segments with none live."""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from kvstore.counters import NamespaceStats, StoreCounters
from kvstore.eviction import LRUOrder, ReclaimStep, SegmentUsage, plan_reclaim
from kvstore.index import IndexRecord, IndexTable
from kvstore.namespaces import NamespaceTable
from kvstore.pins import PinSet
from kvstore.segments import CorruptRecord, SegmentWriter, read_raw_record, segment_path

log = logging.getLogger(__name__)


class SpaceKeeper:
    """The part of `KVStore` that decides where records go and what leaves to make room.

    A base class rather than an object of its own: it works on the store's own tables
    (index, LRU order, segment and namespace usage), which `KVStore` builds at open and
    replaces wholesale on a clear, under the store's lock. Invariants:
    - bytes under `root` (segments, index.bin, namespaces.json, pins.json) stay within
      `max_disk_bytes`, plus at most half a segment while a compaction copies records;
    - `_usage[n]` mirrors segment file n: its size, live record bytes and live slots;
    - `_ns_stats[i]` holds the live bytes and blocks of namespace id i;
    - the segment being appended to is rolled, never deleted.
    """

    max_disk_bytes: int
    segment_bytes: int
    counters: StoreCounters
    _namespace_caps: dict[str, int]
    _segments_dir: Path
    _index: IndexTable
    _namespaces: NamespaceTable
    _pins: PinSet
    _lru: LRUOrder
    _ns_stats: defaultdict[int, NamespaceStats]
    _usage: dict[int, SegmentUsage]
    _writer: SegmentWriter
    _readers: dict[int, int]  # segment number -> descriptor open for reading
    _unsynced: set[int]  # segments written since the last flush

    @property
    def disk_bytes(self) -> int:
        segments = sum(usage.size for usage in self._usage.values())
        return segments + self._index.file_bytes + self._namespaces.file_bytes + self._pins.file_bytes

    def _wants_pinned(self, record: IndexRecord) -> bool:
        """Whether a snapshot pins this record (`KVStore` keeps the pins)."""
        return False

    def _make_room(self, namespace_id: int | None, namespace: str, size: int) -> bool:
        """Evict (and reclaim segments) until a record of `size` fits every cap."""
        cap = self._namespace_caps.get(namespace)
        if namespace_id is not None and cap is not None:
            if size > cap:
                return False
            while self._ns_stats[namespace_id].bytes + size > cap:
                victim = self._lru.oldest(namespace_id)
                if victim is None:  # what is left of it is pinned
                    return False
                self._evict(victim)
        if self._index.file_bytes + self._namespaces.file_bytes + self._pins.file_bytes + size > self.max_disk_bytes:
            return False
        while self.disk_bytes + size > self.max_disk_bytes:
            victim = self._lru.oldest()
            spare = self._index.record(victim).segment if victim is not None else None
            step = plan_reclaim(self._usage, self._writer.number, spare=spare)
            if step is not None:
                self._reclaim(step)
            elif victim is not None:
                self._evict(victim)
            else:
                return False
        return True

    def _reclaim_all(self) -> None:
        """Give back every byte that needs no eviction (after blocks were dropped)."""
        while (step := plan_reclaim(self._usage, self._writer.number)) is not None:
            self._reclaim(step)

    def _reclaim(self, step: ReclaimStep) -> None:
        if step.action == "delete":
            self._delete_segment(step.segment)
        elif step.action == "compact":
            self._compact(step.segment)
        else:
            self._roll()

    def _compact(self, number: int) -> None:
        """Copy the live records of sealed segment `number` forward, then delete it."""
        usage = self._usage[number]
        fd = self._reader(number)
        for slot in sorted(usage.slots, key=lambda s: self._index.record(s).offset):
            record = self._index.record(slot)
            try:
                header, data = read_raw_record(fd, record.offset, record.length)
                if header.key != record.key:
                    raise CorruptRecord("key does not match the index")
            except (CorruptRecord, OSError) as exc:
                log.warning("segment %d: damaged record at %d (%s); dropped", number, record.offset, exc)
                self.counters.corrupt += 1
                self._drop(slot)
                continue
            segment, offset = self._append(data)
            self._index.update(slot, replace(record, segment=segment, offset=offset))
            usage.live_bytes -= record.length
            usage.slots.discard(slot)
            moved = self._usage[segment]
            moved.live_bytes += record.length
            moved.slots.add(slot)
        self.counters.compactions += 1
        self._delete_segment(number)

    def _append(self, record: bytes) -> tuple[int, int]:
        if self._writer.size and self._writer.size + len(record) > self.segment_bytes:
            self._roll()
        offset = self._writer.append(record)
        self._usage[self._writer.number].size += len(record)
        self._unsynced.add(self._writer.number)
        return self._writer.number, offset

    def _roll(self) -> None:
        self._writer.close()
        self._start_segment(self._writer.number + 1)

    def _start_segment(self, number: int) -> None:
        self._writer = SegmentWriter(segment_path(self._segments_dir, number), number)
        self._usage[number] = SegmentUsage(size=self._writer.size)

    def _delete_segment(self, number: int) -> None:
        assert number != self._writer.number, "the active segment is rolled, never deleted"
        fd = self._readers.pop(number, None)
        if fd is not None:
            os.close(fd)
        segment_path(self._segments_dir, number).unlink(missing_ok=True)
        del self._usage[number]
        self._unsynced.discard(number)
        self.counters.segments_deleted += 1

    def _close_segments(self) -> None:
        """Close the active segment and every read descriptor (the files stay)."""
        self._writer.close()
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()

    def _reader(self, number: int) -> int:
        fd = self._readers.get(number)
        if fd is None:
            fd = self._readers[number] = os.open(segment_path(self._segments_dir, number), os.O_RDONLY)
        return fd

    def _track(self, slot: int, record: IndexRecord) -> None:
        """Count a live record in the LRU order (out of it, if a snapshot pins it) and
        the usage tables."""
        self._lru.add(slot, record.namespace_id, record.last_use)
        if self._wants_pinned(record):
            self._lru.pin(slot, record.namespace_id)
        usage = self._usage[record.segment]
        usage.live_bytes += record.length
        usage.slots.add(slot)
        stats = self._ns_stats[record.namespace_id]
        stats.bytes += record.length
        stats.blocks += 1

    def _drop(self, slot: int) -> None:
        """Remove a record from the index and the usage tables; its bytes stay on disk
        until its segment is compacted or deleted."""
        record = self._index.remove(slot)
        self._lru.remove(slot, record.namespace_id)
        usage = self._usage[record.segment]
        usage.live_bytes -= record.length
        usage.slots.discard(slot)
        stats = self._ns_stats[record.namespace_id]
        stats.bytes -= record.length
        stats.blocks -= 1

    def _evict(self, slot: int) -> None:
        self._drop(slot)
        self.counters.evictions += 1
