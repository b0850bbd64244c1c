"""KVStore: blocks by (namespace, key) in segment files, LRU to a byte cap.

Pure Python, no sockets. The kvstore process puts, clears and flushes from its writer
thread and gets / looks up from its socket loop; one lock makes that safe.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kvstore.eviction import LRUOrder, ReclaimStep, SegmentUsage, plan_reclaim
from kvstore.index import IndexRecord, IndexTable, open_index
from kvstore.namespaces import NamespaceTable, sync_directory
from kvstore.segments import (
    KEY_BYTES,
    CorruptRecord,
    SegmentWriter,
    encode_record,
    list_segments,
    read_raw_record,
    read_record,
    scan_segment,
    segment_path,
)

log = logging.getLogger(__name__)

COMPRESSIONS = ("lz4", "none")


def make_private(root: Path) -> None:
    """Modes 0700 on `root` and the directories under it, 0600 on its files: the blocks
    hold users' prompts, and a store made by an older version was world-readable.
    Symlinks are left alone (chmod would change what they point to)."""
    root.chmod(0o700)
    for directory, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            private = 0o700 if stat.S_ISDIR(mode) else 0o600
            if (stat.S_ISDIR(mode) or stat.S_ISREG(mode)) and stat.S_IMODE(mode) != private:
                os.chmod(path, private)


@dataclass
class StoreCounters:
    hits: int = 0
    misses: int = 0
    puts: int = 0  # blocks written
    duplicates: int = 0  # puts of a key already stored (last use refreshed)
    dropped: int = 0  # puts refused: bigger than a cap allows
    corrupt: int = 0  # records found damaged on read or compaction (then dropped)
    evictions: int = 0
    compactions: int = 0
    segments_deleted: int = 0


@dataclass
class _NamespaceStats:
    bytes: int = 0  # live record bytes on disk (headers included, after compression)
    blocks: int = 0
    hits: int = 0
    misses: int = 0


class KVStore:
    """The cold tier on one directory (see DESIGN.md, "Cold tier").

    Invariants:
    - a get returns the exact bytes put, or None: every read checks the record's CRCs, key
      and namespace, and a damaged record is dropped from the index;
    - bytes under `root` (segments, index.bin, namespaces.json) stay within
      `max_disk_bytes`, plus at most half a segment while a compaction copies records;
    - `_usage[n]` mirrors segment file n: its size, live record bytes and live slots.
    Mutations (put, clear, flush, close) come from one thread at a time; get, lookup and
    stats may run concurrently from another.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        max_disk_bytes: int,
        segment_bytes: int,
        compression: str = "lz4",
        namespace_caps: Mapping[str, int] | None = None,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.root = Path(root)
        self.max_disk_bytes = max_disk_bytes
        self.segment_bytes = segment_bytes
        self._compress = compression == "lz4"
        self._namespace_caps = dict(namespace_caps or {})
        self._lock = threading.RLock()
        self._segments_dir = self.root / "segments"
        self._segments_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private(self.root)
        self.counters = StoreCounters()
        self._closed = False
        with self._lock:
            self._open()

    # ------------------------------------------------------------ open / close

    def _open(self) -> None:
        for leftover in self.root.glob("*.tmp"):  # an atomic rewrite cut short by a crash
            leftover.unlink()
        segments = list_segments(self._segments_dir)
        last = max(segments, default=0)
        if last:
            tail = scan_segment(segments[last], verify_payload=True, truncate=True)
            if tail.good_end < tail.size:
                log.warning("%s: cut %d bytes of torn tail", segments[last].name, tail.size - tail.good_end)
        namespaces = NamespaceTable.load(self.root / "namespaces.json")
        self._index, self._namespaces, self.open_report = open_index(self.root / "index.bin", namespaces, segments)
        self._usage = {number: SegmentUsage(size=path.stat().st_size) for number, path in segments.items()}
        self._lru = LRUOrder()
        self._ns_stats: defaultdict[int, _NamespaceStats] = defaultdict(_NamespaceStats)
        self._clock = 0
        for slot, record in sorted(self._index.live(), key=lambda item: item[1].last_use):
            self._track(slot, record)
            self._clock = record.last_use
        self._readers: dict[int, int] = {}
        self._unsynced: set[int] = set()
        if last and self._usage[last].size < self.segment_bytes:
            self._writer = SegmentWriter(segments[last], last)
        else:
            self._start_segment(last + 1)
        for number in list(self._usage):
            if number != self._writer.number and self._usage[number].live_bytes == 0:
                self._delete_segment(number)
        self._index.mark_open()
        self._make_room(None, "", 0)  # the cap may have been lowered since the last run
        log.info(
            "opened %s: %d blocks in %d segments, %.1f MB on disk (cap %.1f MB)%s",
            self.root, len(self._index), len(self._usage), self.disk_bytes / 1e6, self.max_disk_bytes / 1e6,
            f"; index rebuilt: {self.open_report.reason}" if self.open_report.rebuilt else "",
        )

    def close(self) -> None:
        """Sync everything and mark the index cleanly closed."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
            self._index.close(clean=True)
            self._writer.close()
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ reads

    def lookup(self, namespace: str, keys: Sequence[bytes]) -> int:
        """How many of `keys`, in order from the first, are stored (stops at a miss)."""
        with self._lock:
            namespace_id = self._namespaces.find(namespace)
            num_found = 0
            for key in keys:
                slot = self._index.find(namespace_id, bytes(key)) if namespace_id else None
                if slot is None:
                    break
                self._touch(slot, namespace_id)
                num_found += 1
            self._count(namespace_id, hits=num_found, misses=int(num_found < len(keys)))
            return num_found

    def get(self, namespace: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """The payload of each key, or None for a miss (absent or damaged)."""
        with self._lock:
            namespace_id = self._namespaces.find(namespace)
            found = [self._read(namespace_id, namespace, bytes(key)) for key in keys]
            hits = sum(payload is not None for payload in found)
            self._count(namespace_id, hits=hits, misses=len(keys) - hits)
            return found

    def _read(self, namespace_id: int | None, namespace: str, key: bytes) -> bytes | None:
        slot = self._index.find(namespace_id, key) if namespace_id else None
        if slot is None:
            return None
        record = self._index.record(slot)
        try:
            payload = read_record(self._reader(record.segment), record.offset, record.length, key, namespace)
        except (CorruptRecord, OSError) as exc:
            log.warning(
                "block %s of %r in segment %d is damaged (%s); dropped",
                key.hex()[:16], namespace, record.segment, exc,
            )
            self.counters.corrupt += 1
            self._drop(slot)
            return None
        self._touch(slot, namespace_id)
        return payload

    def _count(self, namespace_id: int | None, *, hits: int, misses: int) -> None:
        self.counters.hits += hits
        self.counters.misses += misses
        if namespace_id:
            self._ns_stats[namespace_id].hits += hits
            self._ns_stats[namespace_id].misses += misses

    # ------------------------------------------------------------ writes

    def put(self, namespace: str, key: bytes, payload: bytes | memoryview) -> bool:
        """Store one block; False if no cap leaves room for it. A key already stored only
        has its last use refreshed."""
        key = bytes(key)
        if len(key) != KEY_BYTES:
            raise ValueError(f"block keys are {KEY_BYTES} bytes, got {len(key)}")
        if self._refresh(namespace, key):
            return True
        record = encode_record(key, namespace, payload, self._compress)  # outside the lock
        with self._lock:
            if self._refresh(namespace, key):
                return True
            namespace_id = self._namespaces.id_of(namespace)
            if not self._index.free_slots:
                self._index.grow()
            if not self._make_room(namespace_id, namespace, len(record)):
                self.counters.dropped += 1
                log.warning("block of %d bytes for %r does not fit its cap; not stored", len(record), namespace)
                return False
            segment, offset = self._append(record)
            self._clock += 1
            index_record = IndexRecord(key, namespace_id, segment, offset, len(record), self._clock)
            self._track(self._index.insert(index_record), index_record)
            self.counters.puts += 1
            return True

    def _refresh(self, namespace: str, key: bytes) -> bool:
        with self._lock:
            namespace_id = self._namespaces.find(namespace)
            slot = self._index.find(namespace_id, key) if namespace_id else None
            if slot is None:
                return False
            self._touch(slot, namespace_id)
            self.counters.duplicates += 1
            return True

    def clear(self, namespace: str | None = None) -> int:
        """Remove every block, or one namespace's; returns how many were removed."""
        with self._lock:
            if namespace is None:
                return self._clear_all()
            namespace_id = self._namespaces.find(namespace)
            if namespace_id is None:
                return 0
            slots = self._lru.slots(namespace_id)
            for slot in slots:
                self._drop(slot)
            while (step := plan_reclaim(self._usage, self._writer.number)) is not None:
                self._reclaim(step)
            log.info("cleared %d blocks of %r", len(slots), namespace)
            return len(slots)

    def _clear_all(self) -> int:
        num_removed = len(self._index)
        self._writer.close()
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        for path in list_segments(self._segments_dir).values():
            path.unlink()
        next_segment = self._writer.number + 1
        self._index.close(clean=False)
        self._index = IndexTable.create(self.root / "index.bin")
        self._index.mark_open()
        self._usage = {}
        self._unsynced = set()
        self._lru = LRUOrder()
        for stats in self._ns_stats.values():
            stats.bytes = stats.blocks = 0
        self._start_segment(next_segment)
        log.info("cleared all %d blocks", num_removed)
        return num_removed

    def flush(self) -> None:
        """Make every write so far durable: segments fsynced, index msynced."""
        with self._lock:
            numbers, self._unsynced = self._unsynced, set()
            fds = []
            for number in numbers:
                if number == self._writer.number:
                    fds.append(os.dup(self._writer.fd))
                elif number in self._usage:
                    fds.append(os.dup(self._reader(number)))
        try:  # outside the lock: readers go on while the disk catches up
            for fd in fds:
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)
        with self._lock:
            self._index.sync()
        sync_directory(self._segments_dir)
        sync_directory(self.root)

    # ------------------------------------------------------------ space

    @property
    def disk_bytes(self) -> int:
        segments = sum(usage.size for usage in self._usage.values())
        return segments + self._index.file_bytes + self._namespaces.file_bytes

    def _make_room(self, namespace_id: int | None, namespace: str, size: int) -> bool:
        """Evict (and reclaim segments) until a record of `size` fits every cap."""
        cap = self._namespace_caps.get(namespace)
        if namespace_id is not None and cap is not None:
            if size > cap:
                return False
            while self._ns_stats[namespace_id].bytes + size > cap:
                victim = self._lru.oldest(namespace_id)
                if victim is None:
                    break
                self._evict(victim)
        if self._index.file_bytes + self._namespaces.file_bytes + size > self.max_disk_bytes:
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

    def _reader(self, number: int) -> int:
        fd = self._readers.get(number)
        if fd is None:
            fd = self._readers[number] = os.open(segment_path(self._segments_dir, number), os.O_RDONLY)
        return fd

    # ------------------------------------------------------------ bookkeeping

    def _track(self, slot: int, record: IndexRecord) -> None:
        self._lru.add(slot, record.namespace_id, record.last_use)
        usage = self._usage[record.segment]
        usage.live_bytes += record.length
        usage.slots.add(slot)
        stats = self._ns_stats[record.namespace_id]
        stats.bytes += record.length
        stats.blocks += 1

    def _drop(self, slot: int) -> None:
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

    def _touch(self, slot: int, namespace_id: int) -> None:
        self._clock += 1
        self._index.touch(slot, self._clock)
        self._lru.touch(slot, namespace_id, self._clock)

    # ------------------------------------------------------------ stats

    def stats(self) -> dict:
        with self._lock:
            namespaces = {
                name: asdict(self._ns_stats[namespace_id])
                for name, namespace_id in self._namespaces.items()
                if namespace_id in self._ns_stats
            }
            return {
                "disk_bytes": self.disk_bytes,
                "live_bytes": sum(usage.live_bytes for usage in self._usage.values()),
                "max_disk_bytes": self.max_disk_bytes,
                "segment_bytes": self.segment_bytes,
                "num_blocks": len(self._index),
                "num_segments": len(self._usage),
                **asdict(self.counters),
                "index_rebuilt": self.open_report.rebuilt,
                "dropped_at_open": self.open_report.num_dropped,
                "namespaces": namespaces,
            }
