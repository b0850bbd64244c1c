"""Why a prompt missed (`worker.miss_reasons`), without MLX: a record fed as the prefix
cache feeds it (whole blocks, then a tail), traced along new prompts."""

from __future__ import annotations

import pytest

from protocol.block_keys import chain_keys
from protocol.cache_misses import CacheMisses, Divergence
from worker.miss_reasons import SeenPrefixes, explain

BLOCK = 4
FP = b"fingerprint-one"


def computed(record: SeenPrefixes, tokens: list[int], salt: str | None = None) -> None:
    """What the prefix cache records for a finished sequence: its whole blocks, its tail."""
    keys = chain_keys(record.fingerprint, tokens, BLOCK, salt)
    record.note_blocks(keys, tokens, 0, len(keys), salt)
    if len(tokens) > len(keys) * BLOCK:
        record.note_tail(keys, tokens[len(keys) * BLOCK :], salt)


def why(record: SeenPrefixes, tokens: list[int], cached: int, salt: str | None = None, cold: int = 0,
        refresh: bool = True) -> CacheMisses:
    trace = record.trace(tokens, salt, refresh)
    return explain(trace, len(tokens), cached, cold)


A = list(range(100, 114))  # 3 whole blocks and a 2-token tail


def test_nothing_seen_is_first_seen() -> None:
    assert why(SeenPrefixes(FP, BLOCK), A, 0).tokens == {"first_seen": 14}


@pytest.mark.parametrize("at", [4, 5, 6, 7, 9, 12, 13])
def test_a_prompt_that_leaves_an_earlier_one_diverged_at_that_token(at: int) -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A)
    other = A[:at] + [7] + A[at + 1 :]
    # the whole blocks before the one that differs, and in the last block the tail's match
    cached = at if at >= 12 else (at // BLOCK) * BLOCK
    misses = why(record, other, cached)
    assert misses.tokens == {"diverged": 14 - cached}
    assert misses.divergence == Divergence(at)


def test_an_exact_repeat_misses_only_its_last_token() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A + [1, 2])  # the first request: its prompt and two generated tokens
    assert why(record, A, 13).tokens == {"partial_block": 1}


def test_what_the_tiers_lost_is_evicted_and_what_ssd_restored_is_counted() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A)
    assert why(record, A, 0).tokens == {"evicted": 13, "partial_block": 1}
    misses = why(record, A, 8, cold=4)
    assert misses.tokens == {"evicted": 5, "partial_block": 1}
    assert misses.evicted_hot_found_cold == 4


def test_a_prompt_that_goes_on_where_the_last_one_ended_is_first_seen_from_there() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A)
    longer = A + [1, 2, 3, 4, 5]
    assert why(record, longer, 14).tokens == {"first_seen": 5}
    assert why(record, longer, 12).tokens == {"evicted": 2, "first_seen": 5}  # the tail was evicted


def test_the_start_of_a_block_only_a_longer_prompt_computed_is_partial_block() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A)
    assert why(record, A[:10], 8).tokens == {"partial_block": 2}


def test_another_salt_is_cache_salt_and_another_fingerprint_model_changed() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A, salt="tenant-a")
    assert why(record, A, 0, salt="tenant-b").tokens == {"cache_salt": 14}
    assert why(record, A, 0).tokens == {"cache_salt": 14}  # no salt is a salt of its own
    fresh = SeenPrefixes(b"fingerprint-two", BLOCK)
    fresh.note_shadow(A[:BLOCK], FP, b"")  # as found on SSD: blocks of the model before it was re-converted
    assert why(fresh, A, 0).tokens == {"model_changed": 14}
    assert why(SeenPrefixes(FP, BLOCK), A, 0, salt="x").tokens == {"first_seen": 14}


def test_a_hit_the_record_cannot_explain_counts_the_rest_as_first_seen() -> None:
    """A restarted worker restores blocks from SSD its (empty) record never saw."""
    assert why(SeenPrefixes(FP, BLOCK), A, 12, cold=12).tokens == {"first_seen": 2}


def test_siblings_pick_the_longest_match() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A)
    computed(record, A[:5] + [0] * 9)
    misses = why(record, A[:9] + [1] * 5, 8)
    assert misses.divergence == Divergence(9)


def test_bounded_and_leaves_go_before_their_parents() -> None:
    record = SeenPrefixes(FP, BLOCK, max_entries=5)
    computed(record, A)  # 3 blocks + tail
    computed(record, [5] * 8)  # 2 more blocks: one of A's entries must go
    assert len(record) == 5
    # A's first blocks are still reachable: what went is a leaf (its tail)
    assert why(record, A, 0).tokens == {"evicted": 12, "first_seen": 2}


def test_a_probe_changes_nothing() -> None:
    record = SeenPrefixes(FP, BLOCK, max_entries=4)
    computed(record, A[:8])  # 2 blocks
    computed(record, [5] * 8)  # 2 blocks: the record is full
    why(record, A[:8] + [1], 0, refresh=False)  # a probe of A's blocks: they stay oldest
    computed(record, [6] * 4)
    assert why(record, A[:8] + [1], 0).tokens["first_seen"] == 9 - 4  # A's second block went


@pytest.mark.parametrize("misses, text", [
    (CacheMisses({"diverged": 545}, 0, Divergence(2071, 3, "user", "content")),
     "545 uncached: diverged at token 2071 (message 3, user content)"),
    (CacheMisses({"evicted": 512, "first_seen": 33}, 256),
     "545 uncached: 512 evicted, 33 first_seen; 256 restored from SSD after hot-tier eviction"),
    (CacheMisses({"partial_block": 1}), "1 uncached: partial_block"),
])
def test_described_in_one_line(misses: CacheMisses, text: str) -> None:
    assert misses.describe() == text


def test_a_shadow_kept_on_ssd_tells_a_new_fingerprint_or_salt_after_a_restart() -> None:
    """The kvstore outlives a worker: the first block's shadow, stored beside the blocks,
    tells the next worker (another fingerprint: the model re-converted) why it misses."""
    ssd: dict[bytes, bytes] = {}

    def fetch(keys: list[bytes]) -> list[memoryview]:
        return [memoryview(ssd[k]) for k in keys[:1] if k in ssd]

    before = SeenPrefixes(FP, BLOCK)
    computed(before, A, salt="s")
    key, data = before.shadow_record(A[:BLOCK], "s")
    ssd[key] = data
    after = SeenPrefixes(b"fingerprint-two", BLOCK)  # a new worker process, another model build
    assert why(after, A, 0, salt="s").tokens == {"first_seen": 14}  # nothing asked of SSD yet
    after.recall_shadow(A, "s", fetch)
    assert why(after, A, 0, salt="s").tokens == {"model_changed": 14}
    same = SeenPrefixes(FP, BLOCK)  # same model, restarted: another salt is told, its own is not a reason
    same.recall_shadow(A, "t", fetch)
    assert why(same, A, 0, salt="t").tokens == {"cache_salt": 14}
    alone = SeenPrefixes(FP, BLOCK)
    alone.recall_shadow(A, "s", fetch)
    assert why(alone, A, 0, salt="s").tokens == {"first_seen": 14}
    ssd[key] = b""  # not a shadow: ignored
    ignored = SeenPrefixes(b"fingerprint-two", BLOCK)
    ignored.recall_shadow(A, "s", fetch)
    assert why(ignored, A, 0, salt="s").tokens == {"first_seen": 14}


def test_another_salt_wins_over_a_template_start_shared_with_this_salt() -> None:
    record = SeenPrefixes(FP, BLOCK)
    computed(record, A, salt="a")
    computed(record, A[:2] + [0] * 12, salt="b")  # another conversation of salt b: the same first 2 tokens
    assert why(record, A, 0, salt="b").tokens == {"cache_salt": 14}
    assert why(record, A[:2] + [9] * 12, 0, salt="b").divergence == Divergence(2)
