"""Which rows of an embedding step run together: sorted by length, so a batch's rows are
padded to the length of its longest one (rounded to a bucket), never to the step's."""

from __future__ import annotations


def plan_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices grouped into batches, longest rows first.

    Invariants: every index appears once; a batch has at most `max_rows` rows, and its
    rows x longest-row tokens stay within `max_tokens` unless it holds a single row; rows
    of similar length share a batch, so padding is at most the spread within one batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[current[0]] if current else lengths[index]
        if current and (len(current) >= max_rows or (len(current) + 1) * longest > max_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
