"""Why a prompt's uncached tokens were uncached: the reasons the worker finds and the
router reports (response `mlxd.cache`, log lines, the cache probe, /metrics).

One vocabulary for both processes, and one way of saying it in a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIRST_SEEN = "first_seen"  # no earlier prompt went this way
DIVERGED = "diverged"  # an earlier prompt shared the prefix up to a token, then differed
EVICTED = "evicted"  # computed before, since evicted from both tiers
CACHE_SALT = "cache_salt"  # the same first block is known under another cache_salt
MODEL_CHANGED = "model_changed"  # ... or under another model fingerprint (weights, dtype, quantization, kernels)
PARTIAL_BLOCK = "partial_block"  # seen before, but the cache cannot use it: the last prompt token, a part of a block
# cached tokens, not misses: blocks evicted from the hot tier and restored from SSD
EVICTED_HOT_FOUND_COLD = "evicted_hot_found_cold"

# the reasons an uncached token has, in the order a log line names them
MISS_REASONS = (EVICTED, DIVERGED, FIRST_SEEN, CACHE_SALT, MODEL_CHANGED, PARTIAL_BLOCK)
REASONS = (*MISS_REASONS, EVICTED_HOT_FOUND_COLD)  # every label of mlxd_prefix_miss_tokens_total


@dataclass
class Divergence:
    """Where a prompt left the way an earlier one went: its prompt token, and the message
    that token renders (index in the conversation as the worker renders it, system first;
    None when it could not be told) with its role and field (content, tool_calls, tools,
    or generation_prompt: the template's text after the last message)."""

    token: int
    message_index: int | None = None
    role: str | None = None
    field: str | None = None

    def describe(self) -> str:
        if self.message_index is None:
            return f"at token {self.token}" + (f" ({self.field})" if self.field else "")
        return f"at token {self.token} (message {self.message_index}, {self.role} {self.field})"


@dataclass
class CacheMisses:
    """A prompt's uncached tokens split by why (`tokens`: reason -> count over
    MISS_REASONS, summing to prompt - cached tokens), the cached tokens that came back
    from SSD after the hot tier lost them (`evicted_hot_found_cold`), and when some
    tokens `diverged`, where (`divergence`; None otherwise)."""

    tokens: dict[str, int] = field(default_factory=dict)
    evicted_hot_found_cold: int = 0
    divergence: Divergence | None = None

    @property
    def uncached_tokens(self) -> int:
        return sum(self.tokens.values())

    def by_reason(self) -> dict[str, int]:
        """Every reason, zeros included (a stable shape for JSON answers and metrics)."""
        counts = {reason: self.tokens.get(reason, 0) for reason in MISS_REASONS}
        counts[EVICTED_HOT_FOUND_COLD] = self.evicted_hot_found_cold
        return counts

    def describe(self) -> str:
        """`545 uncached: diverged at token 2071 (message 3, user content)`; with several
        reasons, each with its count (`512 evicted, 33 diverged at token ...`)."""
        parts = [(reason, n) for reason in MISS_REASONS if (n := self.tokens.get(reason, 0))]
        words = []
        for reason, n in parts:
            where = f" {self.divergence.describe()}" if self.divergence is not None and reason == DIVERGED else ""
            words.append(f"{reason}{where}" if len(parts) == 1 else f"{n} {reason}{where}")
        text = f"{self.uncached_tokens} uncached: {', '.join(words)}" if parts else "0 uncached"
        if self.evicted_hot_found_cold:
            text += f"; {self.evicted_hot_found_cold} restored from SSD after hot-tier eviction"
        return text
