"""The ragged cache holds each row's positions exactly as mlx-lm's batch cache does, and a
rollback gives back only the row's own rejected positions: checked position by position
against caches built from the accepted tokens alone."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

from worker.ragged_kv_cache import RaggedKVCache

HEADS, DIM = 2, 8


def _kv(n: int, seed: int) -> tuple[mx.array, mx.array]:
    key = mx.random.key(seed)
    k1, k2 = mx.random.split(key)
    return mx.random.normal((1, HEADS, n, DIM), key=k1), mx.random.normal((1, HEADS, n, DIM), key=k2)


def _single(keys: mx.array, values: mx.array) -> KVCache:
    cache = KVCache()
    cache.update_and_fetch(keys, values)
    return cache


def _batch(rows: list[tuple[mx.array, mx.array]]) -> BatchKVCache:
    return BatchKVCache.merge([_single(k, v) for k, v in rows])


def _row(cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    return np.array(cache.keys[..., :cache.offset, :]), np.array(cache.values[..., :cache.offset, :])


def test_rows_taken_from_a_batch_cache_extract_to_the_same_positions() -> None:
    rows = [_kv(5, 0), _kv(9, 1), _kv(1, 2)]
    batch = _batch(rows)
    ragged = RaggedKVCache.from_batch(batch)
    assert ragged.lengths.tolist() == [5, 9, 1]
    assert np.array(ragged.offset).tolist() == [5, 9, 1]
    for i, (k, v) in enumerate(rows):
        got_k, got_v = _row(ragged.extract(i))
        want_k, want_v = _row(batch.extract(i))
        assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)
        assert np.array_equal(got_k, np.array(k))


def test_a_rollback_gives_back_each_rows_own_rejected_positions() -> None:
    rows = [_kv(4, 3), _kv(7, 4)]
    ragged = RaggedKVCache.from_batch(_batch(rows))
    new_k, new_v = _kv(3, 5)
    wide_k, wide_v = mx.concatenate([new_k, -new_k]), mx.concatenate([new_v, -new_v])
    keys, values = ragged.update_and_fetch(wide_k, wide_v)
    assert keys.shape[2] == 7 + 3  # every position any row may attend to
    ragged.rollback([2, 0])  # row 0 keeps one of its three, row 1 all three
    assert ragged.lengths.tolist() == [5, 10]
    k0, _ = _row(ragged.extract(0))
    k1, _ = _row(ragged.extract(1))
    assert np.array_equal(k0, np.concatenate([np.array(rows[0][0]), np.array(new_k[:, :, :1])], axis=2))
    assert np.array_equal(k1, np.concatenate([np.array(rows[1][0]), -np.array(new_k)], axis=2))
    # the next step writes over row 0's rejected positions
    one_k, one_v = _kv(1, 6)
    ragged.update_and_fetch(mx.concatenate([one_k, one_k]), mx.concatenate([one_v, one_v]))
    k0, _ = _row(ragged.extract(0))
    assert k0.shape[2] == 6 and np.array_equal(k0[:, :, 5:], np.array(one_k))


def test_the_mask_shows_each_query_its_own_rows_positions_up_to_its_own() -> None:
    ragged = RaggedKVCache.from_batch(_batch([_kv(2, 7), _kv(4, 8)]))
    mask = np.array(ragged.make_mask(2))  # before the step's update, as the model calls it
    assert mask.shape == (2, 1, 2, 6)
    assert mask[0, 0].tolist() == [[True, True, True, False, False, False], [True, True, True, True, False, False]]
    assert mask[1, 0].tolist() == [[True] * 5 + [False], [True] * 6]


def test_a_rollback_of_more_than_was_written_is_refused() -> None:
    ragged = RaggedKVCache.from_batch(_batch([_kv(3, 9)]))
    k, v = _kv(2, 10)
    ragged.update_and_fetch(k, v)
    with pytest.raises(ValueError):
        ragged.rollback([3])


def test_truncate_cuts_rows_back_across_several_steps_and_no_further_than_they_hold() -> None:
    rows = [_kv(2, 14), _kv(5, 15)]
    ragged = RaggedKVCache.from_batch(_batch(rows))
    steps = [_kv(1, 16 + i) for i in range(3)]  # three one-position steps, as a draft model drafts
    for k, v in steps:
        ragged.update_and_fetch(mx.concatenate([k, k]), mx.concatenate([v, v]))
    ragged.truncate(np.array([3, 5]))  # row 0 keeps the first step's position, row 1 none of them
    k0, _ = _row(ragged.extract(0))
    assert k0.shape[2] == 3 and np.array_equal(k0[:, :, 2:], np.array(steps[0][0]))
    assert np.array_equal(_row(ragged.extract(1))[0], np.array(rows[1][0]))
    assert _row(ragged.extract(0, length=2))[0].shape[2] == 2  # a prefix of a row, for a lagging layer
    with pytest.raises(ValueError):
        ragged.truncate(np.array([4, 5]))  # row 0 holds 3 now


def test_filter_and_extend_keep_rows_whole_across_capacities() -> None:
    first = RaggedKVCache.from_batch(_batch([_kv(3, 11), _kv(300, 12)]))  # 512 positions of room
    second_rows = [_kv(6, 13)]
    first.extend(_batch(second_rows))  # mlx-lm's cache is converted on the way in
    assert first.lengths.tolist() == [3, 300, 6]
    assert np.array_equal(_row(first.extract(2))[0], np.array(second_rows[0][0]))
    kept = _row(first.extract(1))[0]
    first.filter([1])
    assert first.lengths.tolist() == [300]
    assert np.array_equal(_row(first.extract(0))[0], kept)
