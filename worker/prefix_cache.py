"""The worker's prefix cache: which part of a prompt is already computed, and capture of
new blocks as prefill and decoding produce them.

Ties the block-key rule (`protocol.block_keys`), the hot tier (`worker.hot_tier`), the
cold tier (`worker.cold_tier`) and the MLX payloads (`worker.kv_blocks`) together for the
engine. Besides whole blocks, a finished request leaves a *tail* (`worker.prefix_tails`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn

from protocol.block_keys import BlockKey, chain_keys, root_key
from protocol.cache_messages import CacheProbed
from protocol.cache_misses import CacheMisses
from worker.breakpoint_pins import DEFAULT_MAX_SHARE, BreakpointPins
from worker.cold_tier import ColdTier, ColdTierStats
from worker.hot_tier import HotTier
from worker.kv_blocks import (SNAPSHOT, BlockPayload, assemble, layer_kinds, positions_held, slice_blocks, slice_span,
                              trim_payload)
from worker.miss_reasons import SeenPrefixes
from worker.prefix_tails import Tails, tail_key

log = logging.getLogger(__name__)

@dataclass
class ColdRun:
    """Blocks of one prompt read from the cold tier ahead of its admission, still encoded: those of
    keys[start : start + len(blocks)]."""

    start: int
    blocks: list[memoryview]
    fetch_s: float


@dataclass
class PinResult:
    """What pinning a snapshot's keys found and did (`PrefixCache.pin`, `store_pinned`)."""

    hot_blocks: int = 0
    hot_bytes: int = 0
    written_blocks: int = 0
    missing_blocks: int = 0
    flushed: bool = True


@dataclass
class PrefixPlan:
    """What the cache offers one prompt: keys of its whole blocks, and the hit."""

    keys: list[BlockKey]
    salt: str | None = None
    cached_tokens: int = 0
    hot_blocks: int = 0
    cold_blocks: int = 0
    cold_bytes: int = 0
    cold_fetch_s: float = 0.0
    tail_tokens: int = 0
    captured_blocks: int = 0  # whole blocks known to be stored, from the start
    misses: CacheMisses | None = None  # why the rest is not cached (`worker.miss_reasons`)
    caches: list[Any] | None = field(default=None, repr=False)


class PrefixCache:
    """Lookup and capture of prompt blocks for one model.

    `enabled` is False when the prefix cache is switched off or the model's cache types
    cannot be captured; then every lookup is a miss and nothing is stored.
    """

    def __init__(self, model: nn.Module, fingerprint: bytes, block_tokens: int, budget_bytes: int,
                 enabled: bool = True, cold: ColdTier | None = None,
                 breakpoint_pin_share: float = DEFAULT_MAX_SHARE) -> None:
        self.model = model
        self.cold = cold
        self.fingerprint = fingerprint
        self.block_tokens = block_tokens
        self.hot = HotTier(budget_bytes if enabled else 0)
        kinds = layer_kinds(model) if enabled else None
        self.kinds = kinds or []
        self.enabled = enabled and kinds is not None and budget_bytes > 0
        if enabled and kinds is None:
            log.warning("this model's cache cannot be captured by blocks; serving it without a prefix cache")
        self.snapshots = SNAPSHOT in self.kinds
        self.tails = Tails(self.hot, whole=self.snapshots)
        self._snapshots: dict[str, list[BlockKey]] = {}  # name -> its distinct keys, pinned in the hot tier
        self.seen = SeenPrefixes(fingerprint, block_tokens, whole_tails=self.snapshots)  # what was computed: miss reasons
        self.breakpoint_pins = BreakpointPins(self.hot, breakpoint_pin_share)  # clients' cache_control, with TTLs

    def segment_tokens(self, prefill_chunk_tokens: int) -> int:
        """Prefill segment length: whole blocks, so every segment ends on a boundary
        (one block when snapshots are involved: they are only valid at the end)."""
        if self.snapshots:
            return self.block_tokens
        return self.block_tokens * max(1, prefill_chunk_tokens // self.block_tokens)

    def _parent(self, keys: list[BlockKey], num_blocks: int, salt: str | None) -> BlockKey:
        return keys[num_blocks - 1] if num_blocks else root_key(self.fingerprint, salt)

    def _usable_blocks(self, prompt_ids: list[int]) -> int:
        """Whole blocks a hit may cover: at least one prompt token must be left to
        prefill, since it yields the first logits."""
        return (len(prompt_ids) - 1) // self.block_tokens

    def read_ahead(self, prompt_ids: list[int], salt: str | None) -> ColdRun | None:
        """Read from the cold tier the blocks of this prompt that follow its hot run, on the
        tokenizer thread, so that waiting for the disk never holds up a decode step.

        Only reads: the hot tier is checked (a membership test, atomic under the GIL), not
        touched, and the blocks stay encoded until `plan` decodes them on the engine's
        thread. The hot run may change before then; `plan` uses what still joins up.
        """
        if not self.enabled or self.cold is None:
            return None
        keys = chain_keys(self.fingerprint, prompt_ids, self.block_tokens, salt)
        usable = self._usable_blocks(prompt_ids)
        start = 0
        while start < usable and keys[start] in self.hot:
            start += 1
        if start == usable:
            return None
        started = time.perf_counter()
        blocks = self.cold.fetch_raw_run(keys[start:usable])
        return ColdRun(start, blocks, time.perf_counter() - started)

    def plan(self, prompt_ids: list[int], salt: str | None, read_ahead: ColdRun | None = None,
             fetch: bool = True) -> PrefixPlan:
        """The longest cached run for this prompt: hot blocks, continued from the cold tier (the
        `read_ahead` blocks, or with `fetch` a read made here), then a tail."""
        if not self.enabled:
            return PrefixPlan(keys=[])
        block = self.block_tokens
        keys = chain_keys(self.fingerprint, prompt_ids, block, salt)
        usable = self._usable_blocks(prompt_ids)
        run: list[BlockPayload] = self.hot.longest_run(keys[:usable]) if usable else []
        plan = PrefixPlan(keys=keys, salt=salt, hot_blocks=len(run))
        fetched: list[BlockPayload] = []
        if self.cold is not None and len(run) < usable and (read_ahead is not None or fetch):
            # the hot run ended early: continue it from the cold tier, and keep what comes back hot
            started = time.perf_counter()
            if read_ahead is None:
                fetched = self.cold.fetch_run(keys[len(run) : usable])
            elif read_ahead.start <= len(run):  # it joins up with the hot run
                fetched = self.cold.decode_run(read_ahead.blocks[len(run) - read_ahead.start :])
            plan.cold_fetch_s = time.perf_counter() - started + (read_ahead.fetch_s if read_ahead else 0.0)
            plan.cold_bytes = sum(p.nbytes for p in fetched)
            plan.cold_blocks = len(fetched)
        num_blocks = len(run) + len(fetched)
        start = num_blocks * block
        # the tail before the restored blocks go in: making room for them must not evict it
        # (and `probe`, which inserts nothing, finds the same)
        tail = self._find_tail(self._parent(keys, num_blocks, salt), prompt_ids[start : len(prompt_ids) - 1])
        for key, payload in zip(keys[len(run) :], fetched):
            self.hot.put(key, payload, payload.nbytes)
        run += fetched
        plan.captured_blocks = len(run)
        if tail is not None:
            num_tail, payload = tail
            run = [*run, payload]
            plan.tail_tokens = num_tail
        if run:
            plan.cached_tokens = start + plan.tail_tokens
            plan.caches = assemble(self.model, run)
        return plan

    def _find_tail(self, parent: BlockKey, following: list[int]) -> tuple[int, BlockPayload] | None:
        """The stored tail under `parent` that covers most of `following`, cut to what it
        covers (whole, with snapshot layers)."""
        best = self.tails.best(parent, following)
        if best is None:
            return None
        n, key = best
        (payload,) = self.hot.longest_run([key])
        return n, payload if self.snapshots else trim_payload(payload, n)

    def probe(self, prompt_ids: list[int], salt: str | None, request_id: str) -> CacheProbed:
        """Where this prompt is cached, as the answer to `request_id`'s ProbeCache (its
        `misses` are the admitter's to fill): the split `plan` would find (hot blocks, cold
        blocks continuing them, a hot tail) and each whole block's tier, without using
        anything: the hot tier is only looked at (no recency moves, no hit counted), the
        kvstore is asked with a probe (no last use moves there) and nothing is read or
        assembled.

        Runs on the tokenizer thread, like `read_ahead`: membership tests and one dict
        lookup per tail are atomic under the GIL, and the tails under a parent are copied
        before they are scanned."""
        block = self.block_tokens
        keys = chain_keys(self.fingerprint, prompt_ids, block, salt)
        result = CacheProbed(request_id, len(prompt_ids), block, keys=list(keys), prefix_cache=self.enabled,
                             pinned=[self.hot.is_pinned(k) for k in keys])
        hot = [k in self.hot for k in keys]
        in_cold: list[bool] | None = [False] * len(keys)
        if self.cold is not None and self.enabled:
            in_cold = self.cold.probe(keys)
            result.cold_tier = "ok" if in_cold is not None else "unavailable"
            in_cold = in_cold or [False] * len(keys)
        result.in_cold_tier = in_cold
        result.tiers = ["hot" if h else "cold" if c else "missing" for h, c in zip(hot, in_cold)]
        if not self.enabled:
            return result
        usable = self._usable_blocks(prompt_ids)
        while result.hot_blocks < usable and hot[result.hot_blocks]:
            result.hot_blocks += 1
        run = result.hot_blocks
        if self.cold is not None:
            while run < usable and in_cold[run]:
                run += 1
        result.cold_blocks = run - result.hot_blocks
        start = run * block
        result.tail_tokens = self.tails.length(self._parent(keys, run, salt), prompt_ids[start : len(prompt_ids) - 1])
        result.hot_tokens = result.hot_blocks * block + result.tail_tokens
        result.cold_tokens = result.cold_blocks * block
        return result

    # ------------------------------------------------------------ snapshots (pins)

    def pin(self, name: str, keys: Sequence[BlockKey]) -> PinResult:
        """Pin `keys` in the hot tier under snapshot `name` (replacing a snapshot of that
        name): never evicted while pinned, including keys that arrive later (restored from
        the cold tier by the next request that starts with them). Engine thread only."""
        self.unpin(name)
        distinct = list(dict.fromkeys(BlockKey(bytes(k)) for k in keys))
        self._snapshots[name] = distinct
        self.hot.pin(distinct)
        return self._pin_result(distinct)

    def unpin(self, name: str) -> bool:
        """Unpin snapshot `name` in the hot tier; False if it was not pinned here."""
        keys = self._snapshots.pop(name, None)
        if keys is None:
            return False
        self.hot.unpin(keys)
        return True

    def _pin_result(self, keys: Sequence[BlockKey]) -> PinResult:
        sizes = [self.hot.nbytes(k) for k in keys]
        present = [n for n in sizes if n is not None]
        return PinResult(hot_blocks=len(present), hot_bytes=sum(present))

    def store_pinned(self, keys: Sequence[BlockKey]) -> PinResult:
        """Make sure each of `keys` is in the cold tier: the writes already queued are flushed first,
        then those the kvstore still lacks are written from the hot tier and flushed too
        (each flush waits for the kvstore's fsync). Thread-safe (runs on the tokenizer
        thread): payloads are read with `peek`, and blocks reach the writer through its queue."""
        keys = [BlockKey(bytes(k)) for k in keys]
        result = self._pin_result(keys)
        if self.cold is None:
            result.flushed = False
            result.missing_blocks = len(keys) - result.hot_blocks
            return result
        result.flushed = self.cold.flush()
        in_cold = self.cold.probe(keys)
        if in_cold is None:
            result.flushed = False
            return result
        for key, stored in zip(keys, in_cold):
            if stored:
                continue
            payload = self.hot.peek(key)
            if payload is None:
                result.missing_blocks += 1
                continue
            self.cold.store(key, payload)
            result.written_blocks += 1
        if result.written_blocks:
            result.flushed = self.cold.flush()
        return result

    def capture(self, plan: PrefixPlan, caches: list[Any], tokens: list[int], num_tokens: int) -> int:
        """Store the whole blocks completed within the first `num_tokens` tokens of `caches`
        (one sequence's cache) that this plan has not stored yet; returns how many."""
        if not self.enabled:
            return 0
        block = self.block_tokens
        complete = num_tokens // block
        if complete <= plan.captured_blocks:
            return 0
        if self.snapshots:
            # a snapshot is only the state at the cache's current position
            if num_tokens % block:
                return 0
            plan.captured_blocks = max(plan.captured_blocks, complete - 1)
        if len(plan.keys) < complete:
            plan.keys = chain_keys(self.fingerprint, tokens, block, plan.salt)
        start = plan.captured_blocks
        for offset, payload in enumerate(slice_blocks(caches, self.kinds, start, complete, block)):
            key = plan.keys[start + offset]
            self.hot.put(key, payload, payload.nbytes)
            if self.cold is not None:
                self.cold.store(key, payload)
        plan.captured_blocks = complete
        self.hot.refresh(plan.keys[:complete])  # the prefix's head stays the newest: evicted last
        self.seen.note_blocks(plan.keys, tokens, start, complete, plan.salt)
        if start == 0 and self.cold is not None:  # a new first block: its shadow in the cold tier, for miss reasons
            self.cold.store(*self.seen.shadow_record(tokens[:block], plan.salt))
        if self.breakpoint_pins.held:  # blocks held before they were computed count now
            self.breakpoint_pins.enforce()
        return complete - start

    def capture_final(self, plan: PrefixPlan, caches: list[Any], tokens: list[int]) -> None:
        """At the end of a request (cache position == len(tokens)): its whole blocks, then
        the tail after the last stored block, so the next turn resumes exactly here. A
        draft model's layers may hold fewer of the tokens (they catch up only when the
        draft next drafts): then only what every layer holds is kept."""
        tokens = tokens[:positions_held(caches, len(tokens))]
        if not self.enabled or not tokens:
            return
        self.capture(plan, caches, tokens, len(tokens))
        start = plan.captured_blocks * self.block_tokens
        if start >= len(tokens):
            return
        parent = self._parent(plan.keys, plan.captured_blocks, plan.salt)
        tail = tuple(tokens[start:])
        self.seen.note_tail(plan.keys[: plan.captured_blocks], tail, plan.salt)
        key = tail_key(parent, tail)
        if key in self.hot:
            self.hot.longest_run([key])  # refresh
            return
        payload = slice_span(caches, self.kinds, start, len(tokens))
        if self.hot.put(key, payload, payload.nbytes):
            self.tails.add(parent, tail, key)

    def clear(self) -> tuple[int, int, int]:
        """Drop the hot tier (but the blocks snapshots pin) and its tails, and the blocks
        still waiting to be written to the cold tier (`mlxd cache clear`: the router clears
        the kvstore next, and these must not land after it). Returns (blocks, bytes, dropped
        writes).

        Safe between engine steps with requests running: each holds its own working cache
        and its plan's keys, so it finishes with the same tokens; blocks it completes
        after the clear are stored as usual (a later prompt reaches them only from the
        first block, so until that is cached again they are unused and age out)."""
        self.breakpoint_pins.release_all()
        num_blocks, num_bytes = self.hot.clear()
        self.tails.clear()
        num_dropped = self.cold.drop_queued() if self.cold is not None else 0
        log.info("hot tier cleared: %d blocks, %.1f MB; %d pending SSD writes dropped",
                 num_blocks, num_bytes / 1e6, num_dropped)
        return num_blocks, num_bytes, num_dropped

    def stats(self) -> dict[str, Any]:
        """The hot tier's and the cold tier's counters, sent with every pong."""
        s = self.hot.stats
        cold = self.cold.stats if self.cold is not None else ColdTierStats()
        return {
            "cold_fetched_blocks": cold.fetched_blocks,
            "cold_fetch_s": cold.fetch_s,
            "cold_corrupt_blocks": cold.corrupt_blocks,
            "cold_read_timeouts": cold.read_timeouts,
            "cold_skipped_fetches": cold.skipped_fetches,
            "cold_queued_blocks": cold.queued_blocks,
            "cold_dropped_blocks": cold.dropped_blocks,
            "cold_write_queue": self.cold.queue_depth() if self.cold else 0,
            "hot_bytes": self.hot.used_bytes,
            "hot_budget_bytes": self.hot.budget_bytes,
            "hot_blocks": len(self.hot),
            "hot_pinned_bytes": self.hot.pinned_bytes,
            "hot_pinned_blocks": self.hot.pinned_blocks,
            # snapshot name -> [its blocks in the hot tier, their bytes]
            "snapshots": {name: [r.hot_blocks, r.hot_bytes] for name, r in
                          ((name, self._pin_result(keys)) for name, keys in self._snapshots.items())},
            "hits": s.hits,
            "misses": s.misses,
            "inserts": s.inserts,
            "evictions": s.evictions,
            **self.breakpoint_pins.stats(),
        }
