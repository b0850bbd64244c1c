"""Prompt lookup: draft tokens for speculative decoding found in the sequence itself, no
draft model. When the text's last few tokens appeared before (in the prompt, or in what
was generated), the tokens that followed them then are proposed to follow now.

Why this is the cheap default for coding agents: an edit turn repeats most of the file it
was given, so whole lines are found and verified in one forward pass; on free text it
rarely finds anything and then proposes nothing, which costs nothing.

How: an index from each n-gram (n from `min_ngram` to `max_ngram`) to the position just
after its latest occurrence that has a continuation; the longest n-gram found wins (a
longer match predicts better). Appending a token updates the index in O(max_ngram), so a
sequence's lookups never rescan its context.
"""

from __future__ import annotations

from collections.abc import Iterable

from worker.draft_planner import MOST_DRAFTS


class PromptLookup:
    """One sequence's context and its n-gram index."""

    def __init__(self, tokens: Iterable[int] = (), min_ngram: int = 2, max_ngram: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._after: dict[tuple[int, ...], int] = {}  # n-gram -> position after its latest continued occurrence
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens (the prompt, then each verified token) and index what they continue."""
        context, after = self.tokens, self._after
        for token in tokens:
            end = len(context)  # the new token's position: every n-gram ending just before it is continued
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                after[tuple(context[end - n:end])] = end
            context.append(int(token))

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest earlier occurrence of the text's
        last n tokens; [] when none occurred before."""
        context = self.tokens
        if limit <= 0:
            return []
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            start = self._after.get(tuple(context[-n:]))
            if start is not None:
                return context[start:start + limit]
        return []


class DraftLength:
    """How many tokens to propose next, from how many of the last proposals were accepted:
    doubled after a fully accepted proposal, cut to just past the accepted run after a
    rejection. Why: a verified token costs little while the proposal is right, but each
    rejected one was computed for nothing, and free text rejects nearly everything."""

    def __init__(self, minimum: int = 1, maximum: int = MOST_DRAFTS, start: int = 4) -> None:
        if not 1 <= minimum <= start <= maximum:
            raise ValueError(f"draft lengths must satisfy 1 <= min ({minimum}) <= start ({start}) <= max ({maximum})")
        self.minimum, self.maximum = minimum, maximum
        self.length = start
        self.proposed = 0
        self.accepted = 0

    def record(self, proposed: int, accepted: int) -> None:
        """A proposal of `proposed` tokens was verified and its first `accepted` kept."""
        if proposed <= 0:
            return
        self.proposed += proposed
        self.accepted += accepted
        if accepted >= proposed:
            self.length = min(self.maximum, max(self.length, proposed) * 2)
        else:
            self.length = max(self.minimum, accepted + 1)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0
