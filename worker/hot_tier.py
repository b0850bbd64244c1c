"""The hot tier: prefix-cache blocks in worker memory, least recently used out first.

Pure bookkeeping over opaque payloads (the MLX arrays live in `worker.kv_blocks`), so
its invariants are testable without MLX.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.block_keys import BlockKey


@dataclass
class HotTierStats:
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0


class HotTier:
    """key -> (payload, nbytes), LRU by bytes under `budget_bytes`.

    Invariants: `used_bytes` is the sum of the stored payloads' `nbytes` and never
    exceeds `budget_bytes` after any call returns; a block is stored once however many
    requests share it (requests read payloads, and build their own working cache from
    them, so a stored payload is never mutated: copy-on-write by construction).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self.used_bytes = 0
        self.stats = HotTierStats()
        self._entries: OrderedDict[BlockKey, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def longest_run(self, keys: Sequence[BlockKey]) -> list[Any]:
        """Payloads of the longest run of `keys`, from the first, that are all present.

        Counts one hit per block found and one miss for the first block not found."""
        run: list[Any] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                self.stats.misses += 1
                break
            self._entries.move_to_end(key)
            run.append(entry[0])
        self.stats.hits += len(run)
        return run

    def put(self, key: BlockKey, payload: Any, nbytes: int) -> bool:
        """Store a block (or refresh its recency); False if it cannot fit at all."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        if nbytes > self.budget_bytes:
            return False
        while self.used_bytes + nbytes > self.budget_bytes:
            _, (_, evicted_bytes) = self._entries.popitem(last=False)
            self.used_bytes -= evicted_bytes
            self.stats.evictions += 1
        self._entries[key] = (payload, nbytes)
        self.used_bytes += nbytes
        self.stats.inserts += 1
        return True

    def clear(self) -> tuple[int, int]:
        """Drop every block; returns (blocks, bytes) dropped. Payloads a running request
        took its working cache from stay alive as long as it holds them, so nothing is
        freed under it. The hit and miss counters go on counting."""
        num_blocks, num_bytes = len(self._entries), self.used_bytes
        self._entries.clear()
        self.used_bytes = 0
        return num_blocks, num_bytes
