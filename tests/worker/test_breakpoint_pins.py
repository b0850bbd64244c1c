"""Breakpoint pins: a prefix held in the real hot tier for its TTL against other traffic,
refreshed by a later hold, released on expiry, refcounted with snapshot pins, and never
more than its share of the tier (pure Python, a fake clock)."""

from __future__ import annotations

import pytest

from protocol.block_keys import BlockKey
from worker.breakpoint_pins import BreakpointPins
from worker.hot_tier import HotTier

BLOCK = 10  # bytes per block in these tests


def key(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(16, "big"))


def keys(*ids: int) -> list[BlockKey]:
    return [key(i) for i in ids]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fill(tier: HotTier, *ids: int) -> None:
    for i in ids:
        assert tier.put(key(i), f"p{i}", BLOCK)


def flood(tier: HotTier, start: int, count: int) -> None:
    """Other traffic: `count` new blocks, enough to push every unpinned block out."""
    for i in range(start, start + count):
        tier.put(key(i), f"x{i}", BLOCK)


def make(budget: int = 100, share: float = 0.5) -> tuple[HotTier, BreakpointPins, Clock]:
    tier, clock = HotTier(budget), Clock()
    return tier, BreakpointPins(tier, share, clock), clock


def test_a_held_prefix_survives_other_traffic_until_its_ttl_runs_out() -> None:
    tier, pins, clock = make()
    fill(tier, 1, 2, 3)
    pins.hold(keys(1, 2), 300)
    flood(tier, 100, 50)
    assert key(1) in tier and key(2) in tier and key(3) not in tier
    clock.now += 299
    assert pins.expire() == 0 and tier.is_pinned(key(1))
    clock.now += 1
    assert pins.expire() == 1 and not tier.is_pinned(key(1)) and tier.pinned_bytes == 0
    flood(tier, 200, 50)
    assert key(1) not in tier and key(2) not in tier


def test_without_a_hold_the_same_traffic_evicts_the_prefix() -> None:
    """The negative control of the test above."""
    tier, _, _ = make()
    fill(tier, 1, 2)
    flood(tier, 100, 50)
    assert key(1) not in tier and key(2) not in tier


def test_a_later_hold_refreshes_the_ttl_and_never_shortens_it() -> None:
    tier, pins, clock = make()
    fill(tier, 1, 2)
    pins.hold(keys(1, 2), 300)
    clock.now += 250
    pins.hold(keys(1, 2), 300)  # a hit 250 s in: 300 s more from now
    assert len(pins.held) == 1 and tier.pinned_bytes == 2 * BLOCK
    clock.now += 299
    assert pins.expire() == 0
    pins.hold(keys(1, 2), 3600)
    pins.hold(keys(1, 2), 300)  # a 5-minute hit does not cut a 1-hour hold short
    clock.now += 3599
    assert pins.expire() == 0
    clock.now += 1
    assert pins.expire() == 1 and not tier.is_pinned(key(1))


def test_keys_not_in_the_tier_yet_are_protected_when_they_arrive() -> None:
    tier, pins, _ = make()
    pins.hold(keys(1, 2), 300)  # held at admission, before prefill computes the blocks
    fill(tier, 1, 2)
    flood(tier, 100, 50)
    assert key(1) in tier and key(2) in tier


def test_nested_prefixes_share_their_blocks_and_let_go_one_by_one() -> None:
    tier, pins, clock = make()
    fill(tier, 1, 2, 3)
    pins.hold(keys(1), 300)  # the system prompt
    clock.now += 100
    pins.hold(keys(1, 2, 3), 300)  # system + history, a later turn
    assert len(pins.held) == 2 and pins.pinned_bytes() == 3 * BLOCK
    clock.now += 200
    assert pins.expire() == 1  # the first hold ends: its block stays pinned by the second
    assert tier.is_pinned(key(1))
    clock.now += 100
    assert pins.expire() == 1 and tier.pinned_bytes == 0


def test_a_block_pinned_by_a_snapshot_and_a_breakpoint_stays_pinned_until_both_let_go() -> None:
    tier, pins, clock = make()
    fill(tier, 1, 2)
    tier.pin(keys(1))  # a named snapshot (PrefixCache.pin)
    pins.hold(keys(1, 2), 300)
    clock.now += 300
    pins.expire()
    assert tier.is_pinned(key(1)) and not tier.is_pinned(key(2))
    pins.hold(keys(1, 2), 300)
    tier.unpin(keys(1))  # the snapshot goes
    assert tier.is_pinned(key(1))
    pins.release_all()
    assert not tier.is_pinned(key(1)) and tier.pinned_bytes == 0


@pytest.mark.parametrize("share, first_kept", [(0.5, False), (0.9, True)])
def test_the_oldest_prefix_lapses_beyond_the_share(share: float, first_kept: bool) -> None:
    tier, pins, clock = make(100, share)
    fill(tier, 1, 2, 3, 4, 5, 6)
    pins.hold(keys(1, 2, 3), 300)
    clock.now += 1
    pins.hold(keys(4, 5, 6), 300)  # 60 bytes held: over 50, within 90
    assert (key(1) in pins.held or key(3) in pins.held) is first_kept
    assert pins.pinned_bytes() <= pins.limit_bytes
    assert pins.num_lapsed == (0 if first_kept else 1)
    assert tier.is_pinned(key(4)) and tier.is_pinned(key(1)) is first_kept


def test_a_prefix_too_large_alone_keeps_its_leading_blocks() -> None:
    tier, pins, _ = make(100, 0.5)
    pins.hold(keys(*range(1, 9)), 300)  # 8 blocks, 80 bytes once they are all computed
    fill(tier, *range(1, 9))
    assert tier.pinned_bytes == 80  # over the share until the capture's check
    pins.enforce()
    assert pins.pinned_bytes() == 50 and tier.pinned_bytes == 50
    assert [tier.is_pinned(key(i)) for i in range(1, 9)] == [True] * 5 + [False] * 3
    flood(tier, 100, 50)  # the tier still takes new blocks
    assert key(5) in tier and key(6) not in tier and key(149) in tier


def test_pins_never_stop_the_tier_from_taking_new_blocks() -> None:
    tier, pins, clock = make(100, 0.5)
    for turn in range(20):  # a long session of ever-longer breakpoint prefixes
        ids = list(range(1, turn + 2))
        fill(tier, *ids)
        pins.hold(keys(*ids), 300)
        clock.now += 1
        assert tier.put(key(1000 + turn), "other", BLOCK), turn
        assert pins.pinned_bytes() <= 50 and tier.used_bytes <= 100


def test_share_zero_pins_nothing_and_stats_report_what_is_held() -> None:
    tier, pins, clock = make(100, 0.0)
    fill(tier, 1)
    pins.hold(keys(1), 300)
    assert not tier.is_pinned(key(1)) and pins.stats()["breakpoint_prefixes"] == 0
    tier, pins, clock = make(100, 0.5)
    fill(tier, 1, 2)
    pins.hold(keys(1, 2, 3), 300)  # key 3 not computed yet: counts nothing
    assert pins.stats() == {"breakpoint_prefixes": 1, "breakpoint_pinned_blocks": 2, "breakpoint_pinned_bytes": 20,
                            "breakpoint_pin_limit_bytes": 50, "breakpoint_lapsed": 0, "breakpoint_expired": 0}
    clock.now += 300
    assert pins.stats()["breakpoint_pinned_bytes"] == 0 and pins.stats()["breakpoint_expired"] == 1
