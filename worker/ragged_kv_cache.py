"""A batch's KV cache with a length per row, so each row can take back a different
number of the positions a step wrote: what speculative decoding needs when one row's
draft is accepted to its end and its neighbour's is rejected at the first token.

mlx-lm's `BatchKVCache` right-aligns every row on one shared end index (its rows differ
only in left padding), so giving back a different number of positions per row would mean
shifting whole rows. Here rows are left-aligned instead: row `b` holds its positions
`[0, lengths[b])`, a step writes each row's new positions at that row's own end (and counts them in), and
a rollback only lowers `lengths`. What lies past a row's length (an earlier step's rejected
drafts, or room another row uses) is masked out of its attention.

Exactness: mlxd's attention kernel (worker/csrc/attention.cpp) sums each row's
probabilities in key order and masked keys add exact zeros, so a row attends to the same
bits here as in a `BatchKVCache` or alone; positions come from the per-row `offset`.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, KVCache

GROWTH = 256  # positions added to the buffers at a time, as mlx-lm's caches do


class RaggedKVCache:
    """One layer's keys and values for a batch of left-aligned rows of their own lengths."""

    def __init__(self, keys: mx.array, values: mx.array, lengths: list[int]) -> None:
        self.keys = keys  # (B, heads, capacity, head_dim)
        self.values = values
        self.lengths = np.array(lengths, dtype=np.int64)  # positions per row
        self._written = 0  # positions the last update wrote per row (what a rollback may give back)
        self.offset = mx.array(self.lengths, dtype=mx.int32)

    @classmethod
    def from_batch(cls, cache: BatchKVCache) -> RaggedKVCache:
        """The rows of mlx-lm's right-aligned cache, each moved to start at position 0."""
        padding = [int(p) for p in np.array(cache.left_padding)]
        end = cache._idx
        lengths = [end - p for p in padding]
        if cache.keys is None:
            raise ValueError("an empty BatchKVCache has no head shape to take")
        capacity = _capacity(max(lengths, default=0))
        return cls(_left_aligned(cache.keys, padding, end, capacity),
                   _left_aligned(cache.values, padding, end, capacity), lengths)

    # ------------------------------------------------------------ the model's side

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write each row's `W` new positions at its own end and return every position any
        row may attend to (the mask, `make_mask`, tells each row which are its own)."""
        width = keys.shape[2]
        end = int(self.lengths.max()) + width if len(self.lengths) else width
        if end > self.keys.shape[2]:
            self._grow(_capacity(end))
        index, after = _step_arrays(self.lengths, width)
        self.keys = mx.put_along_axis(self.keys, mx.broadcast_to(index, keys.shape), keys, axis=2)
        self.values = mx.put_along_axis(self.values, mx.broadcast_to(index, values.shape), values, axis=2)
        self.lengths = self.lengths + width
        self._written = width
        self.offset = after
        return self.keys[..., :end, :], self.values[..., :end, :]

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:  # noqa: N803 (mlx-lm's name)
        """(B, 1, N, S): query `i` of row `b` (at position lengths[b] + i) sees that row's
        keys at positions up to its own."""
        end = int(self.lengths.max()) + N if len(self.lengths) else N
        keys = mx.arange(end)[None, None, :]
        queries = mx.array(self.lengths[:, None] + np.arange(N)[None, :], dtype=mx.int32)[:, :, None]
        return (keys <= queries)[:, None, :, :]

    # ------------------------------------------------------------ the batch's side

    def rollback(self, rejected: list[int]) -> None:
        """After a step: row `b` gives back the last `rejected[b]` positions it wrote
        (rejected drafts; masked from now on and overwritten by later steps)."""
        back = np.asarray(rejected, dtype=np.int64)
        if np.any(back < 0) or np.any(back > self._written):
            raise ValueError(f"cannot give back {rejected} of {self._written} written positions")
        self.lengths = self.lengths - back
        self._written = 0
        self.offset = mx.array(self.lengths, dtype=mx.int32)

    def truncate(self, lengths: np.ndarray) -> None:
        """Cut row `b` back to `lengths[b]` positions, anywhere at or below what it holds:
        a draft model's layers give back drafts its several steps wrote (`rollback` gives
        back only the last step's)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != self.lengths.shape or np.any(lengths < 0) or np.any(lengths > self.lengths):
            raise ValueError(f"cannot cut rows of {self.lengths.tolist()} positions to {lengths.tolist()}")
        self.lengths = lengths.copy()
        self._written = 0
        self.offset = mx.array(self.lengths, dtype=mx.int32)

    def extract(self, idx: int, length: int | None = None) -> KVCache:
        """Row `idx` alone, as mlx-lm's single-sequence cache (what a finished request's
        prefix is captured from); its first `length` positions only, if given."""
        cache = KVCache()
        n = int(self.lengths[idx]) if length is None else min(length, int(self.lengths[idx]))
        cache.keys = mx.contiguous(self.keys[idx:idx + 1, :, :n])
        cache.values = mx.contiguous(self.values[idx:idx + 1, :, :n])
        cache.offset = n
        return cache

    def filter(self, batch_indices: list[int]) -> None:
        """Keep only the given rows (in that order)."""
        self.lengths = self.lengths[list(batch_indices)]
        self.keys = self.keys[mx.array(batch_indices, dtype=mx.int32)] if batch_indices else self.keys[:0]
        self.values = self.values[mx.array(batch_indices, dtype=mx.int32)] if batch_indices else self.values[:0]
        self.offset = mx.array(self.lengths, dtype=mx.int32)
        self._written = 0

    def extend(self, other: RaggedKVCache | BatchKVCache) -> None:
        """Append another batch's rows (mlx-lm's caches are converted first)."""
        if isinstance(other, BatchKVCache):
            other = RaggedKVCache.from_batch(other)
        capacity = max(self.keys.shape[2], other.keys.shape[2])
        mine, theirs = _padded(self.keys, capacity), _padded(other.keys, capacity)
        self.keys = mx.concatenate([mine, theirs])
        self.values = mx.concatenate([_padded(self.values, capacity), _padded(other.values, capacity)])
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.offset = mx.array(self.lengths, dtype=mx.int32)
        self._written = 0

    def size(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def _grow(self, capacity: int) -> None:
        self.keys = _padded(self.keys, capacity)
        self.values = _padded(self.values, capacity)


_last_step: list[Any] = [None, None]  # (key, arrays) of the last `_step_arrays`


def _step_arrays(lengths: np.ndarray, width: int) -> tuple[mx.array, mx.array]:
    """A step's write positions (B, 1, W, 1) and the rows' lengths after it, made once a
    step and shared by every layer (each layer's cache holds the same lengths)."""
    key = (lengths.tobytes(), width)
    if _last_step[0] != key:
        positions = lengths[:, None] + np.arange(width)[None, :]
        _last_step[0] = key
        _last_step[1] = (mx.array(positions[:, None, :, None], dtype=mx.int32),
                         mx.array(lengths + width, dtype=mx.int32))
    return _last_step[1]


def _capacity(positions: int) -> int:
    return max(GROWTH, (positions + GROWTH - 1) // GROWTH * GROWTH)


def _padded(a: mx.array, capacity: int) -> mx.array:
    """`a` with zeros appended along the position axis up to `capacity`."""
    extra = capacity - a.shape[2]
    if extra <= 0:
        return a
    return mx.pad(a, [(0, 0), (0, 0), (0, extra), (0, 0)])


def _left_aligned(a: mx.array, padding: list[int], end: int, capacity: int) -> mx.array:
    rows = [_padded(a[b:b + 1, :, p:end], capacity) for b, p in enumerate(padding)]
    return mx.concatenate(rows) if rows else a[:0]
