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
    """key -> (payload, nbytes), LRU by bytes under `budget_bytes`, never evicting a pinned
    key (a block of a named snapshot).

    Invariants: `used_bytes` is the sum of the stored payloads' `nbytes` and never
    exceeds `budget_bytes` after any call returns; `pinned_bytes` is the part of it held
    by pinned keys (they count against the budget like any block); a block is stored once
    however many requests share it (requests read payloads, and build their own working
    cache from them, so a stored payload is never mutated: copy-on-write by construction).
    A key may be pinned before it is stored: it is protected from the moment it arrives.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self.used_bytes = 0
        self.pinned_bytes = 0
        self.stats = HotTierStats()
        self._entries: OrderedDict[BlockKey, tuple[Any, int]] = OrderedDict()
        self._pins: dict[BlockKey, int] = {}  # key -> how many snapshots pin it

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def nbytes(self, key: BlockKey) -> int | None:
        """The size of a stored block, None if absent; a look that changes no recency."""
        entry = self._entries.get(key)
        return entry[1] if entry is not None else None

    def peek(self, key: BlockKey) -> Any | None:
        """The payload of a stored block, None if absent, without refreshing it or counting
        a hit (safe from another thread: one dict lookup)."""
        entry = self._entries.get(key)
        return entry[0] if entry is not None else None

    def is_pinned(self, key: BlockKey) -> bool:
        return key in self._pins

    @property
    def pinned_blocks(self) -> int:
        return sum(1 for key in self._pins if key in self._entries)

    def pin(self, keys: Sequence[BlockKey]) -> None:
        """Pin each of `keys` once more (call once per snapshot, with its distinct keys)."""
        for key in keys:
            count = self._pins.get(key, 0)
            self._pins[key] = count + 1
            if count == 0 and key in self._entries:
                self.pinned_bytes += self._entries[key][1]

    def unpin(self, keys: Sequence[BlockKey]) -> None:
        """Undo one `pin` of each of `keys`; a key no snapshot pins is evictable again,
        in its place by recency."""
        for key in keys:
            count = self._pins.get(key, 0)
            if count > 1:
                self._pins[key] = count - 1
            elif count == 1:
                del self._pins[key]
                if key in self._entries:
                    self.pinned_bytes -= self._entries[key][1]

    def longest_run(self, keys: Sequence[BlockKey]) -> list[Any]:
        """Payloads of the longest run of `keys`, from the first, that are all present.

        Counts one hit per block found and one miss for the first block not found; the
        run is refreshed as `refresh` does."""
        run: list[Any] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                self.stats.misses += 1
                break
            run.append(entry[0])
        self.stats.hits += len(run)
        self.refresh(keys[: len(run)])
        return run

    def refresh(self, keys: Sequence[BlockKey]) -> None:
        """Mark a chain of blocks (a prefix, first block first) used now, its first block
        most recently: eviction then takes a prefix's last blocks before its first ones.
        A block is only usable behind all the blocks before it, so evicting the head first
        (plain LRU order, which touched the head earliest) lost the whole prefix at once."""
        for key in reversed(keys):
            if key in self._entries:
                self._entries.move_to_end(key)

    def put(self, key: BlockKey, payload: Any, nbytes: int) -> bool:
        """Store a block (or refresh its recency); False if it cannot fit at all, beside
        the pinned blocks (then nothing is evicted for it)."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        if self.pinned_bytes + nbytes > self.budget_bytes:
            return False
        while self.used_bytes + nbytes > self.budget_bytes:
            victim = next(k for k in self._entries if k not in self._pins)  # exists: see the check above
            _, evicted_bytes = self._entries.pop(victim)
            self.used_bytes -= evicted_bytes
            self.stats.evictions += 1
        self._entries[key] = (payload, nbytes)
        self.used_bytes += nbytes
        if key in self._pins:
            self.pinned_bytes += nbytes
        self.stats.inserts += 1
        return True

    def clear(self) -> tuple[int, int]:
        """Drop every block that no snapshot pins; returns (blocks, bytes) dropped.
        Payloads a running request took its working cache from stay alive as long as it
        holds them, so nothing is freed under it. The hit and miss counters go on counting."""
        dropped = [key for key in self._entries if key not in self._pins]
        num_bytes = 0
        for key in dropped:
            num_bytes += self._entries.pop(key)[1]
        self.used_bytes -= num_bytes
        return len(dropped), num_bytes
