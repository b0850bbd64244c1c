"""The prefix cache's own messages between router and worker: clearing a worker's hot
tier, the answer to a probe (the question, `ProbeCache`, sits beside `CountTokens` in
`protocol.messages`: both carry a request whose prompt the worker renders), and pinning a
snapshot's blocks. Re-exported by `protocol.messages`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from protocol.cache_misses import CacheMisses, Divergence  # noqa: F401  (Divergence: nested in CacheMisses)
from protocol.message_base import Message

TIERS = ("hot", "cold", "missing")  # where a probed block is, on its own


@dataclass
class ClearCache(Message):
    """Router -> worker: drop the hot tier (`mlxd cache clear`), between two engine steps.
    Running requests keep their own working caches and finish unchanged. A request too,
    like CountTokens: its one answer (a CacheCleared) ends its stream."""

    type: ClassVar[str] = "clear_cache"
    request_id: str


@dataclass
class CacheCleared(Message):
    """Worker -> router: what a ClearCache removed; the last event for its id."""

    type: ClassVar[str] = "cache_cleared"
    request_id: str
    num_blocks: int  # hot-tier entries (whole blocks and tails)
    num_bytes: int
    # blocks captured before the clear and still waiting for the cold tier: dropped, so that
    # they do not reach the kvstore after the router clears it
    num_dropped_writes: int = 0


@dataclass
class CacheProbed(Message):
    """Worker -> router: the answer to a ProbeCache (`protocol.messages`), the last event
    for its id; the worker's prefix cache builds it (`PrefixCache.probe`).

    The split is what the same request would be served: `hot_tokens` (whole hot blocks,
    then a hot tail), then `cold_tokens` (whole blocks the kvstore holds, continuing the
    hot run), the rest computed; a request's `cached_tokens` is hot + cold. One prompt
    token is always computed (it gives the first logits), so a prompt that ends on a block
    boundary cannot hit its last block. `keys` are every whole block of the prompt, each
    with where it is on its own (`tiers`: TIERS), whether the kvstore has it
    (`in_cold_tier`) and whether a snapshot or a cache breakpoint pins it in the hot tier (`pinned`)."""

    type: ClassVar[str] = "cache_probed"
    request_id: str
    prompt_tokens: int
    block_tokens: int
    hot_tokens: int = 0
    cold_tokens: int = 0
    hot_blocks: int = 0
    cold_blocks: int = 0
    tail_tokens: int = 0  # the part of hot_tokens that is a tail (after the last whole block)
    keys: list[bytes] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)  # per key, one of TIERS
    in_cold_tier: list[bool] = field(default_factory=list)
    pinned: list[bool] = field(default_factory=list)
    cold_tier: str = "off"  # ok | off | unavailable (the kvstore did not answer: cold figures unknown, 0)
    prefix_cache: bool = True  # False: this worker caches nothing (every token is missing)
    misses: CacheMisses | None = None  # why the missing tokens are missing (None: no prefix cache)


@dataclass
class PinPrefix(Message):
    """Router -> worker: pin the blocks `keys` in the hot tier under snapshot `name` (never
    evicted while pinned; keys not there yet are pinned when they arrive), or with `pin`
    False unpin the snapshot. With `store`, also make sure each block is on SSD: those the
    kvstore lacks are written from the hot tier, and the answer comes once the kvstore
    confirmed its writes are on disk. A request: answered by a PrefixPinned or an ErrorEvent."""

    type: ClassVar[str] = "pin_prefix"
    request_id: str
    name: str
    keys: list[bytes] = field(default_factory=list)
    pin: bool = True
    store: bool = False


@dataclass
class PrefixPinned(Message):
    """Worker -> router: the answer to a PinPrefix, the last event for its id."""

    type: ClassVar[str] = "prefix_pinned"
    request_id: str
    name: str
    hot_blocks: int = 0  # of the keys, those in the hot tier now
    hot_bytes: int = 0
    written_blocks: int = 0  # written to SSD for this pin (the kvstore did not have them)
    missing_blocks: int = 0  # neither in the hot tier nor on SSD: must be computed again
    flushed: bool = True  # the kvstore confirmed its writes are on disk (or none were needed)
