"""The kvstore's requests and answers: lookups, streamed gets, puts, flushes, clears, stats,
probes, and the pins of named snapshots.

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


@dataclass
class KVProbe(Message):
    """Which of `keys` the store holds, each on its own (not stopping at a miss). A look
    only: no block's last use changes and no hit or miss is counted (`/admin/cache/probe`)."""

    type: ClassVar[str] = "kv_probe"
    request_id: int
    namespace: str
    keys: list[bytes]


@dataclass
class KVProbeResult(Message):
    type: ClassVar[str] = "kv_probe_result"
    request_id: int
    found: list[bool]


@dataclass
class KVPin(Message):
    """Pin `keys` of `namespace` under the snapshot `name`: never evicted while pinned,
    including keys not stored yet (they are pinned as they arrive). Done in order with the
    puts received before it; the pin set is on disk before the answer. `info` is kept
    with the snapshot and listed with it (model, tokens, block size, ...)."""

    type: ClassVar[str] = "kv_pin"
    request_id: int
    name: str
    namespace: str
    keys: list[bytes]
    info: dict[str, Any]


@dataclass
class KVPinResult(Message):
    """`error` is "" when pinned, else why not ("exists": the name is taken)."""

    type: ClassVar[str] = "kv_pin_result"
    request_id: int
    error: str = ""
    snapshot: dict[str, Any] | None = None  # as KVSnapshotsResult lists it


@dataclass
class KVUnpin(Message):
    """Drop the snapshot `name`: its blocks are evictable again (they stay stored)."""

    type: ClassVar[str] = "kv_unpin"
    request_id: int
    name: str


@dataclass
class KVUnpinResult(Message):
    type: ClassVar[str] = "kv_unpin_result"
    request_id: int
    snapshot: dict[str, Any] | None = None  # None: there was no snapshot of that name (or `error`)
    error: str = ""


@dataclass
class KVSnapshots(Message):
    """The snapshots (of one namespace, or all), with their sizes and keys."""

    type: ClassVar[str] = "kv_snapshots"
    request_id: int
    namespace: str | None = None


@dataclass
class KVSnapshotsResult(Message):
    """Each snapshot: name, namespace, keys (bytes), info, blocks, stored_blocks (of its
    keys, those on disk), bytes (their record bytes on disk), created (unix time)."""

    type: ClassVar[str] = "kv_snapshots_result"
    request_id: int
    snapshots: list[dict[str, Any]]
