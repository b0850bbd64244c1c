"""worker.length_buckets: every row once, batches within their caps, similar lengths together."""

from __future__ import annotations

import pytest

from worker.length_buckets import plan_batches


@pytest.mark.parametrize("lengths, max_rows, max_tokens, expected", [
    ([], 4, 100, []),
    ([5], 4, 100, [[0]]),
    ([3, 9, 4, 8], 2, 100, [[1, 3], [2, 0]]),
    ([3, 9, 4, 8], 8, 20, [[1, 3], [2, 0]]),  # 3 rows of 9 tokens would be 27 > 20
    ([300], 8, 100, [[0]]),  # a row longer than the token cap still runs, alone
    ([7, 7, 7], 8, 1000, [[0, 1, 2]]),
])
def test_plan(lengths: list[int], max_rows: int, max_tokens: int, expected: list[list[int]]) -> None:
    batches = plan_batches(lengths, max_rows, max_tokens)
    assert batches == expected
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= max_rows
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= max_tokens
