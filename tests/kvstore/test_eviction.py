"""LRU order and the choice of segments to reclaim, as plain data."""

from __future__ import annotations

import pytest

from kvstore.eviction import LRUOrder, ReclaimStep, SegmentUsage, plan_reclaim


@pytest.mark.parametrize(
    "operations, namespace, oldest",
    [
        ([], None, None),
        ([("add", 1, 1, 1), ("add", 2, 1, 2)], None, 1),
        ([("add", 1, 1, 1), ("add", 2, 1, 2), ("touch", 1, 1, 3)], None, 2),
        ([("add", 1, 1, 1), ("add", 2, 2, 2), ("remove", 1, 1, 0)], None, 2),
        ([("add", 1, 1, 1), ("add", 2, 2, 2)], 2, 2),
        ([("add", 1, 1, 1), ("add", 2, 2, 2), ("touch", 1, 1, 3)], None, 2),  # across namespaces
        ([("add", 1, 1, 1)], 2, None),
    ],
)
def test_lru_oldest(operations, namespace, oldest) -> None:
    order = LRUOrder()
    for op, slot, namespace_id, last_use in operations:
        if op == "remove":
            order.remove(slot, namespace_id)
        else:
            getattr(order, op)(slot, namespace_id, last_use)
    assert order.oldest(namespace) == oldest


def _usage(size: int, live: int) -> SegmentUsage:
    return SegmentUsage(size=size, live_bytes=live)


@pytest.mark.parametrize(
    "usage, active, spare, step",
    [
        ({1: _usage(100, 100), 2: _usage(50, 50)}, 2, None, None),
        ({1: _usage(100, 0), 2: _usage(100, 10), 3: _usage(5, 5)}, 3, None, ReclaimStep("delete", 1)),
        ({1: _usage(100, 40), 2: _usage(100, 10), 3: _usage(5, 5)}, 3, None, ReclaimStep("compact", 2)),
        ({1: _usage(100, 60), 2: _usage(100, 50), 3: _usage(5, 5)}, 3, None, None),  # not over half dead
        # the next victim's segment is emptied by eviction, not copied forward
        ({1: _usage(100, 40), 2: _usage(100, 10), 3: _usage(5, 5)}, 3, 2, ReclaimStep("compact", 1)),
        ({1: _usage(100, 10), 3: _usage(5, 5)}, 3, 1, None),
        ({1: _usage(100, 10)}, 1, None, ReclaimStep("roll", 1)),  # mostly dead active: seal it
        ({1: _usage(100, 0)}, 1, None, ReclaimStep("roll", 1)),
        ({1: _usage(0, 0)}, 1, None, None),  # an empty active segment is left alone
    ],
)
def test_plan_reclaim(usage, active, spare, step) -> None:
    assert plan_reclaim(usage, active, spare=spare) == step
