"""The kvstore's wire messages round-trip through the codec, payload frames included."""

from __future__ import annotations

import pytest

from protocol.codec import decode, encode
from protocol.messages import (
    MESSAGE_TYPES,
    KVClear,
    KVClearResult,
    KVFlush,
    KVFlushResult,
    KVGet,
    KVGetResult,
    KVLookup,
    KVLookupResult,
    KVPut,
    KVStats,
    KVStatsResult,
)

KEYS = [bytes(range(16)), b"\xff" * 16]

EXAMPLES = [
    KVLookup(1, "smollm2@abc", KEYS),
    KVLookupResult(1, 1),
    KVGet(2, "smollm2@abc", KEYS),
    KVGetResult(2, [True, False]),
    KVPut("smollm2@abc", KEYS),
    KVFlush(3),
    KVFlushResult(3),
    KVStats(4),
    KVStatsResult(4, {"disk_bytes": 10, "namespaces": {"m": {"bytes": 10, "blocks": 1, "hits": 0, "misses": 2}}}),
    KVClear(5, None),
    KVClear(6, "m"),
    KVClearResult(5, 7),
]


def test_examples_cover_every_kv_message_type() -> None:
    kv_types = {tag for tag in MESSAGE_TYPES if tag.startswith("kv_")}
    assert {m.type for m in EXAMPLES} == kv_types


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.type)
@pytest.mark.parametrize("frames", [[], [b"block-0", memoryview(b"\x00" * 1000)]])
def test_round_trip(message, frames) -> None:
    decoded, extra = decode([bytes(p) for p in encode(message, frames)])
    assert decoded == message
    assert type(decoded) is type(message)
    assert extra == [bytes(f) for f in frames]
    for field_name in ("keys",):
        if hasattr(message, field_name):
            assert all(isinstance(k, bytes) for k in getattr(decoded, field_name))
