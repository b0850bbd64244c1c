"""The tails of the prefix cache: a finished request's tokens after its last whole block,
kept under that block's key, so the next turn of a conversation (which starts with exactly
those tokens) recomputes only what is new, not up to a block of old tokens."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from protocol.block_keys import KEY_BYTES, BlockKey
from worker.common_prefix import common_prefix
from worker.hot_tier import HotTier

TAILS_PER_PARENT = 8  # the newest tails kept under one parent block


def tail_key(parent: BlockKey, tokens: Sequence[int]) -> BlockKey:
    """The hot-tier key of a tail: its parent block's key and its tokens."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(parent)
    h.update(b"\x00tail\x00")
    h.update(array("I", tokens).tobytes())
    return BlockKey(h.digest())


class Tails:
    """Parent block key -> the tails stored under it, (tokens, key), newest last.

    The payloads live in the hot tier under their keys; an entry whose payload the hot
    tier evicted is dropped lazily, when its parent is next searched. `whole`: a tail is
    usable only whole (models with snapshot layers: a snapshot cannot be rewound), else
    its first n tokens are (K/V cut to n).
    """

    def __init__(self, hot: HotTier, whole: bool) -> None:
        self.hot = hot
        self.whole = whole
        self._by_parent: dict[BlockKey, list[tuple[tuple[int, ...], BlockKey]]] = {}

    def _covered(self, tokens: tuple[int, ...], following: list[int]) -> int:
        if self.whole:
            return len(tokens) if tuple(following[: len(tokens)]) == tokens else 0
        return common_prefix(tokens, following)

    def best(self, parent: BlockKey, following: list[int]) -> tuple[int, BlockKey] | None:
        """(tokens covered, key) of the stored tail under `parent` that covers most of
        `following`; forgets the tails the hot tier no longer holds. Engine thread."""
        best: tuple[int, BlockKey] | None = None
        alive = []
        for tokens, key in self._by_parent.get(parent, ()):
            if key not in self.hot:
                continue
            alive.append((tokens, key))
            n = self._covered(tokens, following)
            if n > 0 and (best is None or n > best[0]):
                best = (n, key)
        if parent in self._by_parent:
            self._by_parent[parent] = alive
        return best

    def length(self, parent: BlockKey, following: list[int]) -> int:
        """How many of `following` `best` would cover, changing nothing: safe on the
        tokenizer thread (the list under a parent is copied before it is scanned)."""
        covered = [self._covered(tokens, following) for tokens, key in list(self._by_parent.get(parent, ()))
                   if key in self.hot]
        return max(covered, default=0)

    def add(self, parent: BlockKey, tokens: tuple[int, ...], key: BlockKey) -> None:
        """Note a tail the hot tier now holds under `key`; the oldest beyond
        TAILS_PER_PARENT under the same parent are forgotten."""
        entries = self._by_parent.setdefault(parent, [])
        entries.append((tokens, key))
        del entries[:-TAILS_PER_PARENT]

    def clear(self) -> None:
        self._by_parent.clear()
