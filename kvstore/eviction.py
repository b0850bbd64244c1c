"""Which blocks to evict (least recently used, never a pinned one) and which segments to
reclaim.

Eviction only marks index slots dead; disk space comes back when a segment is deleted
(all dead) or compacted (its live records copied forward, then the file deleted).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

COMPACT_DEAD_FRACTION = 0.5  # compacting moves at most half a segment to free the other half


class LRUOrder:
    """Live slots from least to most recently used, kept per namespace, and the pinned
    slots (blocks of named snapshots), which are never offered for eviction.

    Invariants: every live slot is in exactly one namespace's order or in the pinned set,
    with its last use; within a namespace, last uses increase from oldest to newest
    (callers touch with a clock that only goes up, and an unpinned slot goes back in its
    place by last use).
    """

    def __init__(self) -> None:
        self._by_namespace: dict[int, OrderedDict[int, int]] = {}
        self._pinned: dict[int, tuple[int, int]] = {}  # slot -> (namespace id, last use)

    def add(self, slot: int, namespace_id: int, last_use: int) -> None:
        if slot in self._pinned:
            self._pinned[slot] = (namespace_id, last_use)
            return
        order = self._by_namespace.setdefault(namespace_id, OrderedDict())
        order[slot] = last_use
        order.move_to_end(slot)

    touch = add

    def remove(self, slot: int, namespace_id: int) -> None:
        self._pinned.pop(slot, None)
        order = self._by_namespace.get(namespace_id)
        if order is not None:
            order.pop(slot, None)

    def pin(self, slot: int, namespace_id: int) -> None:
        """Take a live slot out of the eviction order (it keeps its last use)."""
        if slot in self._pinned:
            return
        order = self._by_namespace.get(namespace_id)
        last_use = order.pop(slot, 0) if order is not None else 0
        self._pinned[slot] = (namespace_id, last_use)

    def unpin(self, slots: Iterable[int]) -> None:
        """Put pinned slots back in the eviction order, each where its last use puts it."""
        back: dict[int, list[tuple[int, int]]] = {}
        for slot in slots:
            entry = self._pinned.pop(slot, None)
            if entry is not None:
                back.setdefault(entry[0], []).append((slot, entry[1]))
        for namespace_id, entries in back.items():
            order = self._by_namespace.setdefault(namespace_id, OrderedDict())
            merged = sorted([*order.items(), *entries], key=lambda item: item[1])
            self._by_namespace[namespace_id] = OrderedDict(merged)

    def is_pinned(self, slot: int) -> bool:
        return slot in self._pinned

    def pinned(self) -> list[tuple[int, int]]:
        """(slot, namespace id) of every pinned slot."""
        return [(slot, entry[0]) for slot, entry in self._pinned.items()]

    def oldest(self, namespace_id: int | None = None) -> int | None:
        """The least recently used slot that is not pinned, in one namespace or across
        all of them."""
        if namespace_id is not None:
            order = self._by_namespace.get(namespace_id)
            return next(iter(order), None) if order else None
        best: tuple[int, int] | None = None
        for order in self._by_namespace.values():
            if order:
                slot = next(iter(order))
                if best is None or order[slot] < best[1]:
                    best = (slot, order[slot])
        return best[0] if best else None

    def slots(self, namespace_id: int) -> list[int]:
        """The namespace's slots that are not pinned, least recently used first."""
        return list(self._by_namespace.get(namespace_id, ()))

    def __len__(self) -> int:
        return sum(len(order) for order in self._by_namespace.values()) + len(self._pinned)


@dataclass
class SegmentUsage:
    """Bytes in one segment file, how many of them are live records, and which slots."""

    size: int = 0
    live_bytes: int = 0
    slots: set[int] = field(default_factory=set)

    @property
    def dead_fraction(self) -> float:
        return 1.0 - self.live_bytes / self.size if self.size else 0.0


@dataclass(frozen=True)
class ReclaimStep:
    action: Literal["delete", "compact", "roll"]
    segment: int


def plan_reclaim(
    usage: Mapping[int, SegmentUsage],
    active: int,
    *,
    spare: int | None = None,
    threshold: float = COMPACT_DEAD_FRACTION,
) -> ReclaimStep | None:
    """The next step that gives disk space back, or None (then evict more).

    In order: delete a sealed segment with no live record; compact the sealed segment with
    the largest dead fraction above `threshold`; seal (roll) the active segment when it is
    mostly dead, so it can be compacted next. `spare` is the segment holding the next
    eviction victim: copying it forward would move records about to die, so evicting is
    the cheaper way to empty it.
    """
    sealed = {number: seg for number, seg in usage.items() if number != active}
    for number, seg in sealed.items():
        if seg.live_bytes == 0:
            return ReclaimStep("delete", number)
    candidates = [
        (seg.dead_fraction, number)
        for number, seg in sealed.items()
        if number != spare and seg.dead_fraction > threshold
    ]
    if candidates:
        return ReclaimStep("compact", max(candidates)[1])
    current = usage.get(active)
    if current is not None and current.size and active != spare and current.dead_fraction > threshold:
        return ReclaimStep("roll", active)
    if current is not None and current.size and current.live_bytes == 0:
        return ReclaimStep("roll", active)
    return None
