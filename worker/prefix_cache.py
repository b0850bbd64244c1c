"""The worker's prefix cache: which blocks of a prompt are already computed, and capture
of new ones as prefill and decoding produce them.

Ties the block-key rule (`protocol.block_keys`), the hot tier (`worker.hot_cache`) and
the MLX payloads (`worker.kv_blocks`) together for the engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.nn as nn

from protocol.block_keys import BlockKey, chain_keys
from worker.hot_cache import HotCache
from worker.kv_blocks import SNAPSHOT, assemble, layer_kinds, slice_blocks

log = logging.getLogger(__name__)


@dataclass
class PrefixPlan:
    """What the cache offers one prompt: keys of its full blocks, and the hit."""

    keys: list[BlockKey]
    cached_blocks: int = 0
    caches: list[Any] | None = None
    captured_blocks: int = 0
    salt: str | None = None
    hot_blocks: int = 0


class PrefixCache:
    """Lookup and capture of prompt blocks for one model.

    `enabled` is False when the prefix cache is switched off or the model's cache types
    cannot be captured; then every lookup is a miss and nothing is stored.
    """

    def __init__(self, model: nn.Module, fingerprint: bytes, block_tokens: int, budget_bytes: int, enabled: bool = True) -> None:
        self.model = model
        self.fingerprint = fingerprint
        self.block_tokens = block_tokens
        self.hot = HotCache(budget_bytes if enabled else 0)
        kinds = layer_kinds(model) if enabled else None
        self.kinds = kinds or []
        self.enabled = enabled and kinds is not None and budget_bytes > 0
        if enabled and kinds is None:
            log.warning("this model's cache cannot be captured by blocks; serving it without a prefix cache")
        self.snapshots = SNAPSHOT in self.kinds

    def segment_tokens(self, prefill_chunk_tokens: int) -> int:
        """Prefill segment length: whole blocks, so every segment ends on a boundary
        (one block when snapshots are involved: they are only valid at the end)."""
        if self.snapshots:
            return self.block_tokens
        return self.block_tokens * max(1, prefill_chunk_tokens // self.block_tokens)

    def plan(self, prompt_ids: list[int], salt: str | None) -> PrefixPlan:
        if not self.enabled:
            return PrefixPlan(keys=[])
        keys = chain_keys(self.fingerprint, prompt_ids, self.block_tokens, salt)
        # At least one prompt token must be left to prefill: it yields the first logits.
        usable = (len(prompt_ids) - 1) // self.block_tokens
        run = self.hot.longest_run(keys[:usable]) if usable else []
        plan = PrefixPlan(keys=keys, salt=salt)
        if run:
            plan.cached_blocks = plan.captured_blocks = plan.hot_blocks = len(run)
            plan.caches = assemble(self.model, run)
        return plan

    def capture(self, plan: PrefixPlan, caches: list[Any], tokens: list[int], num_tokens: int) -> int:
        """Store the blocks completed within the first `num_tokens` tokens of `caches`
        (one sequence's cache) that this plan has not stored yet; returns how many."""
        if not self.enabled:
            return 0
        complete = num_tokens // self.block_tokens
        if complete <= plan.captured_blocks:
            return 0
        if self.snapshots and (num_tokens % self.block_tokens or complete - plan.captured_blocks > 1):
            # a snapshot is only the state at the cache's current position
            if num_tokens % self.block_tokens == 0:
                plan.captured_blocks = complete - 1
            else:
                return 0
        if len(plan.keys) < complete:
            plan.keys = chain_keys(self.fingerprint, tokens, self.block_tokens, plan.salt)
        start = plan.captured_blocks
        for offset, payload in enumerate(slice_blocks(caches, self.kinds, start, complete, self.block_tokens)):
            self.hot.put(plan.keys[start + offset], payload, payload.nbytes)
        plan.captured_blocks = complete
        return complete - start

    def stats(self) -> dict[str, int]:
        s = self.hot.stats
        return {
            "hot_bytes": self.hot.used_bytes,
            "hot_budget_bytes": self.hot.budget_bytes,
            "hot_blocks": len(self.hot),
            "hits": s.hits,
            "misses": s.misses,
            "inserts": s.inserts,
            "evictions": s.evictions,
        }
