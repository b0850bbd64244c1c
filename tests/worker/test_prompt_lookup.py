"""Prompt lookup's proposals (worker/prompt_lookup.py): what followed the text's last
n-gram before, the longest and latest match first, nothing when nothing matches."""

from __future__ import annotations

import random

import pytest

from worker.prompt_lookup import DraftLength, PromptLookup


def brute_force(context: list[int], limit: int, min_ngram: int, max_ngram: int) -> list[int]:
    """The definition: for the longest n whose last n tokens occur earlier with a token
    after them, what followed their latest such occurrence."""
    for n in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # occurrences ending before the last token
            if context[start:start + n] == tail:
                return context[start + n:start + n + limit]
    return []


def test_an_edit_turn_gets_the_rest_of_the_line_it_repeats() -> None:
    lookup = PromptLookup([5, 6, 7, 8, 9, 10, 11, 3, 4])
    lookup.extend([6, 7])
    assert lookup.propose(3) == [8, 9, 10]
    assert lookup.propose(50) == [8, 9, 10, 11, 3, 4, 6, 7]  # runs to the end of the context


def test_nothing_matches_nothing_is_proposed() -> None:
    lookup = PromptLookup([1, 2, 3, 4])
    lookup.extend([9, 8])
    assert lookup.propose(4) == []
    assert PromptLookup().propose(4) == [] and PromptLookup([1]).propose(4) == []


def test_the_longest_match_wins_over_a_later_shorter_one() -> None:
    # [2, 3] last occurred followed by 7, but [1, 2, 3] only followed by 4
    lookup = PromptLookup([1, 2, 3, 4, 0, 2, 3, 7, 0, 1, 2, 3], min_ngram=2, max_ngram=3)
    assert lookup.propose(1) == [4]


@pytest.mark.parametrize("seed", range(6))
def test_incremental_index_agrees_with_a_scan_of_the_context(seed: int) -> None:
    rng = random.Random(seed)
    context = [rng.randrange(6) for _ in range(300)]  # small alphabet: many repeats
    lookup = PromptLookup(context[:50], min_ngram=2, max_ngram=4)
    for token in context[50:]:
        lookup.extend([token])
        limit = rng.randrange(1, 9)
        assert lookup.propose(limit) == brute_force(lookup.tokens, limit, 2, 4)


def test_the_draft_length_grows_while_accepted_and_falls_after_a_rejection() -> None:
    length = DraftLength(minimum=1, maximum=16, start=4)
    length.record(4, 4)
    assert length.length == 8
    length.record(8, 8)
    length.record(16, 16)
    assert length.length == 16
    length.record(16, 2)
    assert length.length == 3
    length.record(3, 0)
    assert length.length == 1
    assert length.acceptance == pytest.approx(30 / 47)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        PromptLookup(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError):
        DraftLength(minimum=4, maximum=16, start=2)
