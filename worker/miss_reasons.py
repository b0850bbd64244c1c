"""Why a prompt's uncached tokens were uncached: a bounded record of the blocks and tails
this worker computed (`SeenPrefixes`), walked along a new prompt's block keys (`trace`),
and the split of its uncached tokens by reason (`explain`).

Block keys are chained (`protocol.block_keys`), so a key names its whole prefix. At the
first block of a prompt the record does not know, its parent's other children say
whether an earlier prompt went this way and then differed (diverged, at the token where
their ids first differ) or nobody went further (first_seen); a known key that the cache
no longer serves was evicted from both tiers. A digest of the first block's token ids
with no key chain behind it tells a prompt seen under another cache_salt or another model
fingerprint. Pure bookkeeping over keys and token ids: no MLX, testable alone.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.block_keys import KEY_BYTES, BlockKey, chain_keys, root_key
from protocol.cache_misses import (
    CACHE_SALT, DIVERGED, EVICTED, FIRST_SEEN, MODEL_CHANGED, PARTIAL_BLOCK,
    CacheMisses, Divergence,
)
from worker.common_prefix import common_prefix

MAX_ENTRIES = 16384  # blocks and tails remembered (~20 MiB at 256-token blocks: ids are 4 bytes)
MAX_CHILDREN = 16  # continuations remembered per parent key (newest kept)
MAX_SHADOWS = 4096  # first blocks remembered with the (fingerprint, salt) each was seen under
MAX_IDENTITIES = 4  # (fingerprint, salt) pairs remembered per first block


def shadow_digest(first_block: Sequence[int]) -> bytes:
    """The first block's token ids alone, with no model or salt behind them: equal for
    one prompt under every cache_salt and every fingerprint."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(b"mlxd-shadow\x00")
    h.update(array("I", first_block).tobytes())
    return h.digest()


def _salt_digest(salt: str | None) -> bytes:
    return hashlib.blake2b((salt or "").encode("utf-8"), digest_size=8).digest() if salt else b""


@dataclass
class _Entry:
    parent: BlockKey
    tokens: array  # the block's (or tail's) token ids
    is_tail: bool


@dataclass
class SeenTrace:
    """What the record knows of one prompt, whatever the tiers hold now.

    `reusable_tokens`: what the cache would serve had nothing been evicted (known whole
    blocks up to the last usable one, then the best remembered tail); `seen_tokens`: the
    longest prefix an earlier prompt shared; `reason`: why the tokens from `seen_tokens`
    on are new (None: the whole prompt was seen before)."""

    reusable_tokens: int = 0
    seen_tokens: int = 0
    reason: str | None = FIRST_SEEN
    divergence: Divergence | None = None  # reason diverged: where (the message is told later)


class SeenPrefixes:
    """The blocks and tails computed by this worker, newest last, and the first blocks'
    shadows; thread-safe (the engine thread records, the tokenizer thread traces).

    Bounds: at most MAX_ENTRIES entries (a block holds `block_tokens` ids; a tail fewer
    than two blocks' worth), at most MAX_CHILDREN continuations per parent (the oldest go
    first), MAX_SHADOWS shadows of MAX_IDENTITIES pairs each. The least recently recorded
    or traced entry goes first. The record lives in the worker: a restart forgets it, so
    afterwards what SSD does not restore counts as first_seen.
    """

    def __init__(self, fingerprint: bytes, block_tokens: int, whole_tails: bool = False,
                 max_entries: int = MAX_ENTRIES, max_shadows: int = MAX_SHADOWS) -> None:
        """`whole_tails`: a tail is usable only whole (models with snapshot caches)."""
        self.fingerprint = fingerprint
        self.block_tokens = block_tokens
        self.whole_tails = whole_tails
        self.max_entries = max_entries
        self.max_shadows = max_shadows
        self._lock = threading.Lock()
        self._entries: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._children: dict[BlockKey, list[BlockKey]] = {}  # parent -> child keys, oldest first
        self._shadows: OrderedDict[bytes, list[tuple[bytes, bytes]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    # ---------------------------------------------------------------- recording

    def note_blocks(self, keys: Sequence[BlockKey], tokens: Sequence[int], start: int, end: int,
                    salt: str | None) -> None:
        """Blocks `start` to `end` (exclusive) of a sequence were computed: `keys` are its
        block keys (at least `end` of them), `tokens` its ids."""
        block = self.block_tokens
        with self._lock:
            for j in reversed(range(start, end)):  # deepest first: the record drops leaves before their parents
                parent = keys[j - 1] if j else root_key(self.fingerprint, salt)
                ids = array("I", tokens[j * block : (j + 1) * block])
                self._add(BlockKey(bytes(keys[j])), _Entry(parent, ids, False))
                if j == 0:
                    self._note_shadow(ids, salt)
            self._refresh(keys[:start])

    def note_tail(self, keys: Sequence[BlockKey], tokens: Sequence[int], salt: str | None) -> None:
        """A sequence ended `tokens` after its whole blocks `keys` (none: after the root)."""
        parent = keys[-1] if keys else root_key(self.fingerprint, salt)
        ids = array("I", tokens)
        h = hashlib.blake2b(digest_size=KEY_BYTES)
        h.update(parent)
        h.update(b"\x00seen-tail\x00")
        h.update(ids.tobytes())
        with self._lock:
            self._add(BlockKey(h.digest()), _Entry(parent, ids, True))
            self._refresh(keys)

    def _refresh(self, chain: Sequence[BlockKey]) -> None:
        """Make `chain`'s entries the newest, the first one last: a parent outlives its
        children, so what the record keeps is always reachable from a root."""
        for key in reversed(chain):
            if key in self._entries:
                self._entries.move_to_end(key)

    def _add(self, key: BlockKey, entry: _Entry) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = entry
        children = self._children.setdefault(entry.parent, [])
        children.append(key)
        if len(children) > MAX_CHILDREN:
            self._drop(children[0])
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: BlockKey) -> None:
        entry = self._entries.pop(key)
        children = self._children.get(entry.parent)
        if children is not None:
            children.remove(key)
            if not children:
                del self._children[entry.parent]

    def _note_shadow(self, first_block: array, salt: str | None) -> None:
        digest = shadow_digest(first_block)
        identity = (self.fingerprint, _salt_digest(salt))
        identities = self._shadows.pop(digest, [])
        if identity in identities:
            identities.remove(identity)
        identities.append(identity)
        self._shadows[digest] = identities[-MAX_IDENTITIES:]
        while len(self._shadows) > self.max_shadows:
            self._shadows.popitem(last=False)

    def note_shadow(self, first_block: Sequence[int], fingerprint: bytes, salt_digest: bytes) -> None:
        """A first block seen under another identity, as found elsewhere (the kvstore)."""
        with self._lock:
            identities = self._shadows.pop(shadow_digest(first_block), [])
            identities = [i for i in identities if i != (fingerprint, salt_digest)] + [(fingerprint, salt_digest)]
            self._shadows[shadow_digest(first_block)] = identities[-MAX_IDENTITIES:]
            while len(self._shadows) > self.max_shadows:
                self._shadows.popitem(last=False)

    def shadow_record(self, first_block: Sequence[int], salt: str | None) -> tuple[BlockKey, bytes]:
        """(key, bytes) to keep on SSD for a first block: the kvstore outlives this
        worker, so a worker of the same model id with another fingerprint (re-converted,
        another dtype or quantization) finds it there (`recall_shadow`)."""
        identity = bytes([len(self.fingerprint)]) + self.fingerprint + _salt_digest(salt)
        return BlockKey(shadow_digest(first_block)), identity

    def recall_shadow(self, prompt_ids: Sequence[int], salt: str | None,
                      fetch: Callable[[list[BlockKey]], list[Any]]) -> None:
        """When the record knows nothing of the prompt's first block, read its shadow
        from SSD with `fetch` (the cold tier's raw read: one small record), so a trace
        can tell cache_salt or model_changed. Tokenizer thread only: it waits on the kvstore."""
        if len(prompt_ids) < self.block_tokens:
            return
        first = prompt_ids[: self.block_tokens]
        digest = shadow_digest(first)
        with self._lock:
            if digest in self._shadows:
                return
        found = fetch([BlockKey(digest)])
        if not found:
            return
        data = bytes(found[0])
        if not data or len(data) < 1 + data[0]:
            return  # not a shadow: ignore it
        fingerprint, salt_digest = data[1 : 1 + data[0]], data[1 + data[0] :]
        self.note_shadow(first, fingerprint, salt_digest)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._children.clear()
            self._shadows.clear()

    # ---------------------------------------------------------------- tracing

    def trace(self, prompt_ids: Sequence[int], salt: str | None, refresh: bool = True,
              keys: Sequence[BlockKey] | None = None) -> SeenTrace:
        """Walk the prompt's block `keys` (made here if not given) through the record. With `refresh` every entry
        the prompt reaches becomes the newest (a probe passes False: it changes nothing).
        Costs a dict lookup per block and one comparison of at most MAX_CHILDREN
        continuations with the tokens after the last known block."""
        block, total = self.block_tokens, len(prompt_ids)
        if keys is None:
            keys = chain_keys(self.fingerprint, prompt_ids, block, salt)
        usable = (total - 1) // block  # one token is always left to compute
        root = root_key(self.fingerprint, salt)
        with self._lock:
            known = 0
            while known < len(keys) and keys[known] in self._entries:
                known += 1
            trace = SeenTrace()
            whole = min(known, usable)
            trace.reusable_tokens = whole * block + self._best_tail(
                keys[whole - 1] if whole else root, prompt_ids[whole * block : total - 1], refresh)
            start = known * block
            rest = prompt_ids[start:]
            parent = keys[known - 1] if known else root
            candidates = [(k, self._entries[k]) for k in self._children.get(parent, ())]
            matched = [(common_prefix(e.tokens, rest), k, e) for k, e in candidates]
            best = max((n for n, _, _ in matched), default=0)
            trace.seen_tokens = start + best
            # a first block known only under another salt or model says more than a
            # template's first tokens shared with another conversation of this one
            other = self._shadow_reason(prompt_ids, salt) if known == 0 else FIRST_SEEN
            if best == len(rest):
                trace.reason = None
            elif other != FIRST_SEEN:
                trace.reason, trace.seen_tokens = other, 0
            elif any(n == best and len(e.tokens) > best for n, _, e in matched):
                trace.reason = DIVERGED
                trace.divergence = Divergence(start + best)
            else:
                trace.reason = FIRST_SEEN  # nobody went this way, or earlier prompts stopped where this one goes on
            if refresh:
                for n, key, _ in matched:
                    if n == best and n:
                        self._entries.move_to_end(key)
                self._refresh(keys[:known])
        trace.reusable_tokens = min(trace.reusable_tokens, trace.seen_tokens)
        return trace

    def _best_tail(self, parent: BlockKey, following: Sequence[int], refresh: bool) -> int:
        best, best_key = 0, None
        for key in self._children.get(parent, ()):
            entry = self._entries[key]
            if not entry.is_tail:
                continue
            if self.whole_tails:
                n = len(entry.tokens) if array("I", following[: len(entry.tokens)]) == entry.tokens else 0
            else:
                n = common_prefix(entry.tokens, following)
            if n > best:
                best, best_key = n, key
        if refresh and best_key is not None:
            self._entries.move_to_end(best_key)
        return best

    def _shadow_reason(self, prompt_ids: Sequence[int], salt: str | None) -> str:
        """cache_salt or model_changed when the prompt's first block was seen under
        another identity; first_seen otherwise (or when the prompt has no whole block)."""
        if len(prompt_ids) < self.block_tokens:
            return FIRST_SEEN
        identities = self._shadows.get(shadow_digest(prompt_ids[: self.block_tokens]), ())
        others = [i for i in identities if i != (self.fingerprint, _salt_digest(salt))]
        if any(fingerprint != self.fingerprint for fingerprint, _ in others):
            return MODEL_CHANGED
        return CACHE_SALT if others else FIRST_SEEN


def explain(trace: SeenTrace, prompt_tokens: int, cached_tokens: int, cold_tokens: int = 0) -> CacheMisses:
    """Split the `prompt_tokens - cached_tokens` uncached tokens of a prompt by reason:
    from the cached ones to what the cache would have served had nothing been evicted,
    evicted; the rest `trace.reason` (tokens an earlier prompt shared inside the block
    where this one diverged are lost to the divergence), or partial_block when the whole
    prompt was seen before (the last prompt token, always computed, and tokens only a
    longer prompt's whole block holds). `cold_tokens` of the cached ones came back from
    SSD (evicted_hot_found_cold).

    The record may have forgotten what the tiers still hold (it is bounded; a restart
    empties it): when the hit reaches past what it knows, the tokens after the hit count
    as first_seen."""
    cached = max(0, min(cached_tokens, prompt_tokens))
    reusable = max(trace.reusable_tokens, cached)
    reason, divergence = trace.reason, trace.divergence
    if trace.seen_tokens < cached and reason is not None:
        reason, divergence = FIRST_SEEN, None
    counts = {EVICTED: reusable - cached, reason or PARTIAL_BLOCK: prompt_tokens - reusable}
    misses = CacheMisses({k: v for k, v in counts.items() if v > 0}, min(cold_tokens, cached))
    if misses.tokens.get(DIVERGED):
        misses.divergence = divergence
    return misses

