"""The kvstore's requests and answers: lookups, streamed gets, puts, flushes, clears, stats.

Any DEALER peer -> kvstore ROUTER. Keys are 16-byte block keys (`protocol.block_keys`),
scoped by `namespace` (one per model fingerprint). Block payloads are opaque bytes and
travel as extra frames, one per key, in key order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.message_base import Message


@dataclass
class KVLookup(Message):
    """How many of `keys`, in order from the first, the store holds (stops at a miss)."""

    type: ClassVar[str] = "kv_lookup"
    request_id: int
    namespace: str
    keys: list[bytes]


@dataclass
class KVLookupResult(Message):
    type: ClassVar[str] = "kv_lookup_result"
    request_id: int
    num_found: int


@dataclass
class KVGet(Message):
    """Fetch the payloads of `keys`; one round trip for a whole run of blocks."""

    type: ClassVar[str] = "kv_get"
    request_id: int
    namespace: str
    keys: list[bytes]
    # one KVGetResult per block, sent as each is read, ending at the first miss: the
    # asker decodes block i while block i+1 is read and sent
    stream: bool = False


@dataclass
class KVGetResult(Message):
    """`found[i]` per asked key; one extra frame per found key, in key order. A corrupt
    record is reported as not found, never as wrong bytes."""

    type: ClassVar[str] = "kv_get_result"
    request_id: int
    found: list[bool]
    seq: int = 0  # streamed gets: position of this block among the asked keys
    done: bool = True  # streamed gets: the last message for this request


@dataclass
class KVPut(Message):
    """Store one extra frame per key; write-behind, no reply. A key already stored is a
    no-op that refreshes its last use."""

    type: ClassVar[str] = "kv_put"
    namespace: str
    keys: list[bytes]


@dataclass
class KVFlush(Message):
    """Answered once every put received before it is written and fsynced."""

    type: ClassVar[str] = "kv_flush"
    request_id: int


@dataclass
class KVFlushResult(Message):
    type: ClassVar[str] = "kv_flush_result"
    request_id: int


@dataclass
class KVStats(Message):
    """Counters and sizes; also the kvstore's liveness ping."""

    type: ClassVar[str] = "kv_stats"
    request_id: int


@dataclass
class KVStatsResult(Message):
    type: ClassVar[str] = "kv_stats_result"
    request_id: int
    stats: dict[str, Any]


@dataclass
class KVClear(Message):
    """Drop every block (`namespace` None) or one namespace's blocks."""

    type: ClassVar[str] = "kv_clear"
    request_id: int
    namespace: str | None = None


@dataclass
class KVClearResult(Message):
    type: ClassVar[str] = "kv_clear_result"
    request_id: int
    num_removed: int
