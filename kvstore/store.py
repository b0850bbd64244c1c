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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstore.counters import NamespaceStats, StoreCounters
from kvstore.eviction import LRUOrder, SegmentUsage
from kvstore.index import IndexRecord, IndexTable, open_index
from kvstore.namespaces import NamespaceTable
from kvstore.pins import PINS_FILE, PinSet, Snapshot
from kvstore.segments import CorruptRecord, SegmentWriter, encode_record, list_segments, read_record, scan_segment
from kvstore.space import SpaceKeeper
from protocol.atomic_files import TEMP_SUFFIX, sync_directory
from protocol.block_keys import KEY_BYTES

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


class KVStore(SpaceKeeper):
    """The cold tier on one directory (docs/architecture.md, "The cache").

    Invariants:
    - a get returns the exact bytes put, or None: every read checks the record's CRCs, key
      and namespace, and a damaged record is dropped from the index;
    - the bytes on disk stay within the caps (`SpaceKeeper`, in `kvstore.space`, keeps
      them there and states how).
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
        for leftover in self.root.glob(f"*{TEMP_SUFFIX}"):  # an atomic rewrite cut short by a crash
            leftover.unlink()
        segments = list_segments(self._segments_dir)
        last = max(segments, default=0)
        if last:
            tail = scan_segment(segments[last], verify_payload=True, truncate=True)
            if tail.good_end < tail.size:
                log.warning("%s: cut %d bytes of torn tail", segments[last].name, tail.size - tail.good_end)
        namespaces = NamespaceTable.load(self.root / "namespaces.json")
        self._index, self._namespaces, self.open_report = open_index(self.root / "index.bin", namespaces, segments)
        self._pins = PinSet(self.root / PINS_FILE)
        self._usage = {number: SegmentUsage(size=path.stat().st_size) for number, path in segments.items()}
        self._lru = LRUOrder()
        self._ns_stats = defaultdict(NamespaceStats)
        self._clock = 0
        for slot, record in sorted(self._index.live(), key=lambda item: item[1].last_use):
            self._track(slot, record)
            self._clock = record.last_use
        self._readers = {}
        self._unsynced = set()
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
            self._close_segments()

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

    def probe(self, namespace: str, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored, without using it: no last use changes (the LRU
        order stays as it was) and no hit or miss is counted."""
        with self._lock:
            namespace_id = self._namespaces.find(namespace)
            if namespace_id is None:
                return [False] * len(keys)
            return [self._index.find(namespace_id, bytes(key)) is not None for key in keys]

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
        """Remove every block, or one namespace's; returns how many were removed. Blocks
        pinned by a snapshot stay (unpin the snapshot to let them go)."""
        with self._lock:
            if namespace is None and not self._lru.pinned():
                return self._clear_all()
            names = [namespace] if namespace is not None else [name for name, _ in self._namespaces.items()]
            num_removed = 0
            for name in names:
                namespace_id = self._namespaces.find(name)
                if namespace_id is None:
                    continue
                slots = self._lru.slots(namespace_id)
                for slot in slots:
                    self._drop(slot)
                num_removed += len(slots)
            self._reclaim_all()
            log.info("cleared %d blocks of %s (pinned blocks kept: %d)", num_removed,
                     repr(namespace) if namespace is not None else "every namespace", len(self._lru.pinned()))
            return num_removed

    def _clear_all(self) -> int:
        num_removed = len(self._index)
        self._close_segments()
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
            with self._lock:
                self._index.sync()
            sync_directory(self._segments_dir)
            sync_directory(self.root)
        except OSError:
            with self._lock:  # not durable yet: the next flush tries these segments again
                self._unsynced |= numbers
            raise
        finally:
            for fd in fds:
                os.close(fd)

    # ------------------------------------------------------------ snapshots (pins)

    def pin(self, name: str, namespace: str, keys: Sequence[bytes], info: Mapping[str, Any]) -> dict[str, Any] | None:
        """Pin `keys` of `namespace` under `name`, durably, before returning: those stored
        leave the eviction order now, the others as they are put. None if `name` is taken."""
        with self._lock:
            if name in self._pins:
                return None
            snapshot = self._pins.add(name, namespace, keys, dict(info))
            namespace_id = self._namespaces.find(namespace)
            for key in snapshot.keys:
                slot = self._index.find(namespace_id, key) if namespace_id else None
                if slot is not None:
                    self._lru.pin(slot, namespace_id)
            log.info("snapshot %r pinned: %d blocks of %r", name, len(snapshot.keys), namespace)
            return self._describe(snapshot)

    def unpin(self, name: str) -> dict[str, Any] | None:
        """Drop the snapshot `name` (durably): its blocks no other snapshot pins are
        evictable again, in their place by last use. None if there is no such snapshot."""
        with self._lock:
            removed = self._pins.remove(name)
            if removed is None:
                return None
            snapshot, freed = removed
            description = self._describe(snapshot)
            namespace_id = self._namespaces.find(snapshot.namespace)
            slots = [self._index.find(namespace_id, key) for key in freed] if namespace_id else []
            self._lru.unpin(slot for slot in slots if slot is not None)
            log.info("snapshot %r unpinned: %d blocks of %r evictable again", name, len(freed), snapshot.namespace)
            return description

    def snapshots(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every snapshot (of `namespace`, or all), by name, with what of it is stored."""
        with self._lock:
            return [self._describe(s) for s in self._pins if namespace is None or s.namespace == namespace]

    def _describe(self, snapshot: Snapshot) -> dict[str, Any]:
        namespace_id = self._namespaces.find(snapshot.namespace)
        stored = num_bytes = 0
        for key in snapshot.keys:
            slot = self._index.find(namespace_id, key) if namespace_id else None
            if slot is not None:
                stored += 1
                num_bytes += self._index.record(slot).length
        return {"name": snapshot.name, "namespace": snapshot.namespace, "keys": list(snapshot.keys),
                "info": dict(snapshot.info), "created": snapshot.created, "blocks": len(snapshot.keys),
                "stored_blocks": stored, "bytes": num_bytes}

    def _wants_pinned(self, record: IndexRecord) -> bool:
        """A block just tracked (put, or found at open) that a snapshot pins."""
        if not len(self._pins):
            return False
        name = self._namespaces.name_of(record.namespace_id)
        return name is not None and self._pins.is_pinned(name, record.key)

    # ------------------------------------------------------------ recency

    def _touch(self, slot: int, namespace_id: int) -> None:
        self._clock += 1
        self._index.touch(slot, self._clock)
        self._lru.touch(slot, namespace_id, self._clock)

    # ------------------------------------------------------------ stats

    def stats(self) -> dict:
        with self._lock:
            pinned: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # namespace id -> [blocks, bytes]
            for slot, namespace_id in self._lru.pinned():
                pinned[namespace_id][0] += 1
                pinned[namespace_id][1] += self._index.record(slot).length
            namespaces = {
                name: {**asdict(self._ns_stats[namespace_id]), "pinned_blocks": pinned[namespace_id][0],
                       "pinned_bytes": pinned[namespace_id][1]}
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
                "pinned_blocks": sum(blocks for blocks, _ in pinned.values()),
                "pinned_bytes": sum(num_bytes for _, num_bytes in pinned.values()),
                "num_snapshots": len(self._pins),
                **asdict(self.counters),
                "index_rebuilt": self.open_report.rebuilt,
                "dropped_at_open": self.open_report.num_dropped,
                "namespaces": namespaces,
            }
