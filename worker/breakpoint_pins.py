"""Hot-tier pins with a lifetime: the blocks before a client's cache breakpoint (Anthropic
`cache_control`) stay in the hot tier until the breakpoint's TTL runs out.

Pure bookkeeping over the hot tier's refcounted pins (`HotTier.pin` / `unpin`, which the
named snapshots use too: a block both pin stays pinned until both let go), with an
injectable clock, so it is testable without MLX.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from protocol.block_keys import BlockKey

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARE = 0.5


class PinnableTier(Protocol):
    """What the pins need of the hot tier (`worker.hot_tier.HotTier`)."""

    budget_bytes: int

    def pin(self, keys: Sequence[BlockKey]) -> None: ...

    def unpin(self, keys: Sequence[BlockKey]) -> None: ...

    def nbytes(self, key: BlockKey) -> int | None: ...


@dataclass
class HeldPrefix:
    """One breakpoint's prefix: its whole blocks' keys (from the first), pinned until
    `expires_at` (a clock reading)."""

    keys: list[BlockKey]
    expires_at: float
    ttl_s: float


class BreakpointPins:
    """Prefixes held in the hot tier for a time, by the key of their last block (which,
    chained, names the whole prefix and its salt).

    Invariants: every key of every held prefix is pinned in the tier exactly once per
    prefix that holds it (released exactly once: on expiry, lapse, trim or `release_all`);
    `held` is ordered by last refresh, oldest first; after `enforce` the bytes of the
    distinct held keys present in the tier are at most `max_share` of its budget, so
    breakpoints can never leave the tier unable to take new blocks. Engine thread only.
    """

    def __init__(self, tier: PinnableTier, max_share: float = DEFAULT_MAX_SHARE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tier = tier
        self.max_share = max_share
        self.clock = clock
        self.held: OrderedDict[BlockKey, HeldPrefix] = OrderedDict()
        self.num_lapsed = 0  # prefixes released early to keep within the bound
        self.num_expired = 0
        self.block_bytes = 0  # the largest held block seen: what a held key not computed yet will take

    @property
    def limit_bytes(self) -> int:
        return int(self.tier.budget_bytes * self.max_share)

    def hold(self, keys: Sequence[BlockKey], ttl_s: float) -> None:
        """Hold the prefix of `keys` for `ttl_s` from now: pin it (keys not in the tier yet
        are protected from the moment they arrive), or refresh it if it is held already
        (its lifetime never shortens). Then the bound is enforced."""
        if not keys or self.max_share <= 0:
            return
        now = self.clock()
        last = keys[-1]
        held = self.held.get(last)
        if held is None:
            held = HeldPrefix(list(keys), now + ttl_s, ttl_s)
            self.tier.pin(held.keys)
            self.held[last] = held
        else:
            held.expires_at = max(held.expires_at, now + ttl_s)
            held.ttl_s = max(held.ttl_s, ttl_s)
            self.held.move_to_end(last)
        self.enforce()

    def expire(self) -> int:
        """Release every prefix whose time is up; returns how many."""
        now = self.clock()
        done = [last for last, held in self.held.items() if held.expires_at <= now]
        for last in done:
            self.tier.unpin(self.held.pop(last).keys)
        self.num_expired += len(done)
        return len(done)

    def pinned_bytes(self) -> int:
        """Bytes of the distinct held keys the tier holds now."""
        return self._held_bytes(prospective=False)

    def _held_bytes(self, prospective: bool = True) -> int:
        """Bytes of the distinct held keys; `prospective` counts each key not in the tier
        yet as one block of the largest size seen, since it is pinned for when it arrives."""
        distinct = {key for held in self.held.values() for key in held.keys}
        sizes = [self.tier.nbytes(key) for key in distinct]
        present = [n for n in sizes if n is not None]
        self.block_bytes = max([self.block_bytes, *present])
        return sum(present) + (self.block_bytes * (len(sizes) - len(present)) if prospective else 0)

    def enforce(self) -> int:
        """Keep the held bytes within `max_share` of the tier's budget: the least recently
        refreshed prefixes lapse first; a last prefix too large alone keeps only its leading
        blocks that fit. Held keys not computed yet count as one block each (they are
        protected from the moment they arrive), so the bound holds once they do. Returns
        how many bytes were released. Called after each hold and after each capture."""
        before = used = self._held_bytes()
        limit = self.limit_bytes
        while used > limit and len(self.held) > 1:
            _, held = self.held.popitem(last=False)
            self.tier.unpin(held.keys)
            self.num_lapsed += 1
            used = self._held_bytes()
            log.warning("cache breakpoint of %d blocks released %.0f s early: breakpoints may pin at most %.0f%% of "
                        "the hot tier (%.1f MB; breakpoint_pin_share)", len(held.keys),
                        held.expires_at - self.clock(), self.max_share * 100, limit / 1e6)
        if used > limit and self.held:
            last, held = next(iter(self.held.items()))
            num_blocks, keep = len(held.keys), self._fitting(held.keys, limit)
            self.tier.unpin(held.keys[keep:])
            del self.held[last]
            if keep:
                held.keys = held.keys[:keep]
                self.held[held.keys[-1]] = held
            self.num_lapsed += 1
            log.warning("cache breakpoint of %d blocks keeps its first %d: breakpoints may pin at most %.0f%% of the "
                        "hot tier (%.1f MB; breakpoint_pin_share)", num_blocks, keep, self.max_share * 100, limit / 1e6)
            used = self._held_bytes()
        return before - used

    def _fitting(self, keys: list[BlockKey], limit: int) -> int:
        """How many leading `keys` fit in `limit` bytes (each one not computed yet as one
        block of the largest size seen)."""
        total = 0
        for i, key in enumerate(keys):
            size = self.tier.nbytes(key)
            total += self.block_bytes if size is None else size
            if total > limit:
                return i
        return len(keys)

    def release_all(self) -> int:
        """Release every held prefix (the hot tier is being cleared); returns how many."""
        num = len(self.held)
        for held in self.held.values():
            self.tier.unpin(held.keys)
        self.held.clear()
        return num

    def stats(self) -> dict[str, int]:
        """For the status route: what breakpoints hold now (expired ones released first)."""
        self.expire()
        distinct = {key for held in self.held.values() for key in held.keys}
        sizes = [n for n in (self.tier.nbytes(key) for key in distinct) if n is not None]
        return {"breakpoint_prefixes": len(self.held), "breakpoint_pinned_blocks": len(sizes),
                "breakpoint_pinned_bytes": sum(sizes), "breakpoint_pin_limit_bytes": self.limit_bytes,
                "breakpoint_lapsed": self.num_lapsed, "breakpoint_expired": self.num_expired}
