"""What a store counts: totals since it was opened, and bytes, blocks, hits and misses per
namespace. `KVStore.stats` reports them all."""

from __future__ import annotations

from dataclasses import dataclass


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
class NamespaceStats:
    bytes: int = 0  # live record bytes on disk (headers included, after compression)
    blocks: int = 0
    hits: int = 0
    misses: int = 0
