"""A tool call that `max_tokens` never cuts: near the end of the budget, a call in progress
is closed by the shortest completion the grammar allows, and a call that could no longer
be finished is not begun.

Why here: a cut call is the worst answer an agent can get (its text is neither a call nor
prose), and only the worker knows, token by token, how much budget is left and where the
grammar stands.

How the shortest completion is found: llguidance has no "shortest path" query, so a copy
of the matcher is walked greedily: at each position, of the tokens the grammar allows, the
one that closes the most (`}` and `]` count, `{`, `[`, `,`, `;` and bare space count
against; inside a string, a token that ends it first), ties to the longest. That walk is
not guaranteed to be the global shortest, but it is short (a string closes at once, an
object at its required keys' shortest values) and every token of it is valid; the budget
starts forcing it while MARGIN tokens are still to spare.
"""

from __future__ import annotations

from dataclasses import dataclass

import llguidance
import numpy as np

from worker.vocabulary import TokenVocabulary

ZONE = 64  # tokens left from which a call in progress checks its shortest completion each step
MARGIN = 4  # forced once the completion needs all but this many of the tokens left
RECHECK = 8  # steps between walks while the budget is still far from the last one found
QUOTE = ord('"')
_NUMBER = b"0123456789.eE+-"


class JsonQuotes:
    """Whether the text fed so far ends inside a JSON string (the one fact the greedy
    walk needs that the matcher does not expose)."""

    def __init__(self, in_string: bool = False, escaped: bool = False) -> None:
        self.in_string = in_string
        self.escaped = escaped

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.escaped:
                self.escaped = False
            elif self.in_string and byte == 0x5C:  # backslash
                self.escaped = True
            elif byte == QUOTE:
                self.in_string = not self.in_string

    def copy(self) -> JsonQuotes:
        return JsonQuotes(self.in_string, self.escaped)


@dataclass(frozen=True)
class TokenShapes:
    """Per token: its length in bytes, its first byte (-1: none) and how much it closes."""

    lengths: np.ndarray
    first: np.ndarray
    closing: np.ndarray


def _shapes(tokens: list[bytes]) -> TokenShapes:
    lengths = np.array([len(t) for t in tokens], dtype=np.int32)
    first = np.array([t[0] if t else -1 for t in tokens], dtype=np.int16)
    closing = np.array([_closing(t) for t in tokens], dtype=np.int16)
    return TokenShapes(lengths, first, closing)


def _closing(token: bytes) -> int:
    """How much `token` closes: brackets it shuts count double, those it opens and the
    separators that lead to more (`,`, Llama's `;`) against it; space is never needed,
    and neither is more than one token of a number (a number may grow forever: a walk
    that preferred its digits to the `,` after them would never end)."""
    if token and (not token.strip() or not token.strip(_NUMBER)):
        return -2
    opened = token.count(b"{") + token.count(b"[") + token.count(b",") + token.count(b";")
    return 2 * (token.count(b"}") + token.count(b"]")) - opened


def token_shapes(vocabulary: TokenVocabulary) -> TokenShapes:
    return vocabulary.derived("call_budget.shapes", _shapes)


def opening_tokens(vocabulary: TokenVocabulary, trigger: str) -> np.ndarray:
    """Which tokens could begin `trigger` or hold it whole: those ending in a non-empty
    prefix of it, or containing it. Masking them keeps a trigger from being written."""
    text = trigger.encode()

    def build(tokens: list[bytes]) -> np.ndarray:
        prefixes = tuple(text[:k] for k in range(1, len(text)))
        first = text[:1]
        opening = np.zeros(len(tokens), dtype=np.bool_)
        for i, t in enumerate(tokens):
            if first in t:  # only these can hold a prefix: the rest are skipped at C speed
                opening[i] = text in t or t.endswith(prefixes)
        return opening

    return vocabulary.derived(f"call_budget.opening:{trigger}", build)


def _preference(vocabulary: TokenVocabulary) -> tuple[np.ndarray, np.ndarray]:
    """Every token but EOS in the walk's order of preference: most closing first, then
    longest, then highest id (the order a sort of the allowed tokens would give); and the
    same with the tokens that begin with a quote first (inside a string, a token that
    ends it wins)."""
    eos = tuple(sorted(vocabulary.eos_token_ids))
    shapes = token_shapes(vocabulary)  # out here: a table built inside another's build would wait on its lock

    def build(tokens: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        ids = np.arange(len(tokens), dtype=np.int64)
        order = np.lexsort((ids, shapes.lengths, shapes.closing))[::-1]
        order = order[~np.isin(order, np.array(eos, dtype=np.int64))]
        quoted = shapes.first[order] == QUOTE
        return order, np.concatenate([order[quoted], order[~quoted]])

    return vocabulary.derived(f"call_budget.preference:{eos}", build)


_CHUNK = 2048  # tokens of the preference order tested at once: the first allowed is nearly always in the first


def _first_allowed(words: np.ndarray, order: np.ndarray) -> int | None:
    """The first token of `order` whose bit is set in the mask `words`."""
    for start in range(0, order.size, _CHUNK):
        ids = order[start:start + _CHUNK]
        hits = np.flatnonzero((words[ids >> 5] >> (ids & 31)) & 1)
        if hits.size:
            return int(ids[hits[0]])
    return None


def shortest_completion(matcher: llguidance.LLMatcher, quotes: JsonQuotes, vocabulary: TokenVocabulary,
                        limit: int = ZONE) -> list[int] | None:
    """The greedy shortest way (see the module docstring) from `matcher`'s state to one
    where its grammar accepts, as tokens; None when none is found within `limit` tokens.
    Works on copies: `matcher` and `quotes` are left as they are.

    Why a preference order and not a sort of the allowed tokens: inside a string nearly
    the whole vocabulary is allowed, and listing and sorting it cost a millisecond per
    token of the walk, on the engine loop; the order's first allowed token is the same
    token and is nearly always found in its first chunk."""
    anywhere, quote_first = _preference(vocabulary)
    walk, quotes = matcher.deep_copy(), quotes.copy()
    words = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
    path: list[int] = []
    while not walk.is_accepting():
        if len(path) >= limit or walk.is_error() or walk.is_stopped():
            return None
        walk.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        token = _first_allowed(words, quote_first if quotes.in_string and not quotes.escaped else anywhere)
        if token is None or not walk.consume_token(token):
            return None
        quotes.feed(vocabulary.token_bytes(token))
        path.append(token)
    return path
