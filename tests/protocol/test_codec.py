"""Every wire message round-trips through the codec, extra frames included."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from protocol.cache_misses import CacheMisses, Divergence
from protocol.cache_breakpoints import TTL_1H_S, CacheBreakpoint
from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.messages import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    AbortRequest,
    AddRequest,
    CacheCleared,
    CacheProbed,
    EmbeddingsEvent,
    EmbedRequest,
    RerankEvent,
    RerankRequest,
    ClearCache,
    PinPrefix,
    PrefixPinned,
    ProbeCache,
    Constraint,
    CountTokens,
    ErrorEvent,
    EventBatch,
    FinishEvent,
    Hello,
    KVClear,
    KVClearResult,
    KVPin,
    KVPinResult,
    KVProbe,
    KVProbeResult,
    KVSnapshots,
    KVSnapshotsResult,
    KVUnpin,
    KVUnpinResult,
    KVFlush,
    KVFlushResult,
    KVGet,
    KVGetResult,
    KVLookup,
    KVLookupResult,
    KVPut,
    KVStats,
    KVStatsResult,
    KVStoreConfig,
    KVStoreReady,
    Ping,
    Pong,
    ProgressEvent,
    PromptEvent,
    Ready,
    SamplingParams,
    Shutdown,
    StartupFailed,
    Timings,
    TokenCount,
    TokenEvent,
    TokenLogprobs,
    Usage,
    WorkerConfig,
)
from protocol.settings import KVStoreSettings, WorkerSettings

EXAMPLES = [
    Hello(PROTOCOL_VERSION, "worker", 1234),
    WorkerConfig(PROTOCOL_VERSION, "m", "/models/m", WorkerSettings(max_num_seqs=4, dtype="float32"), 1 << 20,
                 "ipc:///tmp/kv"),
    Ready(PROTOCOL_VERSION, "m", 8192, 8, 512, 256, "float32", "cpu", "blis", 1.5, 10, [2], tool_dialect="hermes"),
    StartupFailed("no such file"),
    KVStoreConfig(PROTOCOL_VERSION, "/cache/kv", "ipc:///tmp/kv",
                  KVStoreSettings(max_disk_bytes=1 << 30, compression="none"), {"model-a": 1 << 20}),
    KVStoreReady(PROTOCOL_VERSION, "/cache/kv", "ipc:///tmp/kv", 12, 1 << 20),
    Ping(7, 1.25),
    Pong(7, 1.25, 3, 1),
    Shutdown(2.0),
    AddRequest(
        "r1",
        messages=[{"role": "user", "content": "héllo 東京 🎉"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        sampling=SamplingParams(max_tokens=5, temperature=0.0, stop=["\n"], logit_bias={42: -100.0}, seed=3),
        cache_salt="tenant-a",
    ),
    AddRequest("r2", prompt=[1, 2, 3]),
    AddRequest("r6", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
               cache_breakpoints=[CacheBreakpoint(TTL_1H_S, num_tools=2), CacheBreakpoint(message_index=0),
                                  CacheBreakpoint(message_index=1, content_chars=1)]),
    AddRequest("r3", prompt="once upon"),
    AddRequest("r4", prompt="{", constraint=Constraint("json_schema", '{"type": "object"}'),
               sampling=SamplingParams(logprobs=True, top_logprobs=2)),
    AbortRequest("r1"),
    PromptEvent("r1", 20, 16),
    PromptEvent("r6", 700, 256, 400, 100),
    ProgressEvent("r1", 10, 20),
    TokenEvent("r1", "Par", [123], 3.5),
    TokenEvent("r4", "\u00e9", [9], 3.6, TokenLogprobs([b"\xc3\xa9"], [-0.5], [[b"\xc3\xa9", b"\xc3"]], [[-0.5, -1.25]])),
    FinishEvent("r1", "stop", Usage(20, 3, 16), Timings(0.1, 0.2, 0.3, 0.4, 5.0, 100.0)),
    FinishEvent("r6", "length", Usage(2593, 3, 2048, 512, 1 << 20, CacheMisses(
        {"diverged": 520, "evicted": 25}, 512, Divergence(2071, 3, "user", "content")))),
    FinishEvent("r7", "stop", Usage(20, 3, 0, misses=CacheMisses({"first_seen": 20}))),
    FinishEvent("r8", "stop", Usage(700, 3, 256, 256, 1 << 20, cache_creation_tokens=400, cache_creation_1h_tokens=100)),
    ErrorEvent("r1", "prompt too long", 400, "invalid_request_error", "messages", "context_length_exceeded"),
    ErrorEvent("r5", "prompt too long", 400, "invalid_request_error", "messages", "context_length_exceeded",
               9000, 8192),
    CountTokens(AddRequest("c1", messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function"}])),
    TokenCount("c1", 27),
    ClearCache("cache-clear-1"),
    CacheCleared("cache-clear-1", 12, 3 << 20, 2),
    CacheCleared("cache-clear-2", 0, 0),
    ProbeCache(AddRequest("probe-1", prompt="once upon", cache_salt="s")),
    CacheProbed("probe-1", 700, 256, hot_tokens=300, cold_tokens=256, hot_blocks=1, cold_blocks=1, tail_tokens=44,
                keys=[b"k" * 16, b"j" * 16], tiers=["hot", "cold"], in_cold_tier=[True, True],
                pinned=[False, False], cold_tier="ok"),
    CacheProbed("probe-2", 3, 256, prefix_cache=False),
    CacheProbed("probe-3", 30, 16, misses=CacheMisses({"cache_salt": 30}, 0, Divergence(0))),
    PinPrefix("pin-1", "snap", [b"k" * 16], store=True),
    PinPrefix("pin-2", "snap", pin=False),
    PrefixPinned("pin-1", "snap", 1, 1 << 20, 1, 0, True),
    EventBatch([
        PromptEvent("r2", 20, 0),
        TokenEvent("r1", "Par", [123], 3.5),
        FinishEvent("r1", "stop", Usage(20, 3, 16), Timings(0.1, 0.2, 0.3, 0.4, 5.0, 100.0)),
        ErrorEvent("r3", "boom", 500, "server_error"),
    ]),
    EventBatch([]),
    KVLookup(1, "model-a", [b"k" * 16, b"j" * 16]),
    KVLookupResult(1, 1),
    KVGet(2, "model-a", [b"k" * 16]),
    KVGetResult(2, [True, False]),
    KVGet(7, "model-a", [b"k" * 16], stream=True),
    KVGetResult(7, [True], seq=3, done=False),
    KVPut("model-a", [b"k" * 16]),
    KVFlush(3),
    KVFlushResult(3),
    KVStats(4),
    KVStatsResult(4, {"bytes": 10, "namespaces": {"model-a": {"blocks": 1}}}),
    KVClear(5, None),
    KVClear(6, "model-a"),
    KVClearResult(6, 2),
    KVProbe(8, "model-a", [b"k" * 16, b"j" * 16]),
    KVProbeResult(8, [True, False]),
    KVPin(9, "snap", "model-a", [b"k" * 16], {"model": "model-a", "tokens": 256}),
    KVPinResult(9, "", {"name": "snap", "keys": [b"k" * 16], "blocks": 1}),
    KVPinResult(10, "exists"),
    KVUnpin(11, "snap"),
    KVUnpinResult(11, {"name": "snap"}),
    KVUnpinResult(12, None, "disk full"),
    KVSnapshots(13, None),
    KVSnapshots(14, "model-a"),
    KVSnapshotsResult(14, [{"name": "snap", "keys": [b"k" * 16], "info": {}}]),
    EmbedRequest("emb-1", ["a text", [101, 7592]], truncate=True, dimensions=64),
    EmbeddingsEvent("emb-1", 2, 2, 5, vectors=b"\x00\x00\x80\x3f" * 4),
    RerankRequest("rr-1", "query", ["doc a", "doc b"]),
    RerankEvent("rr-1", [0.25, 0.75], 9, "cosine"),
]


def test_examples_cover_every_message_type() -> None:
    assert {m.type for m in EXAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.type)
@pytest.mark.parametrize("frames", [[], [b"\x00\x01", memoryview(b"tensor-bytes")]])
def test_round_trip(message, frames) -> None:
    parts = encode(message, frames)
    wire = [bytes(p) for p in parts]  # what ZMQ delivers
    decoded, extra = decode(wire)
    assert decoded == message
    assert type(decoded) is type(message)
    # fields marked FRAME (EmbeddingsEvent.vectors) travel as frames after the given ones
    num_own = sum(1 for f in dataclasses.fields(message) if f.metadata.get("frame"))
    assert extra[:len(frames)] == [bytes(f) for f in frames] and len(extra) == len(frames) + num_own
    if hasattr(message, "keys"):  # block keys stay bytes (msgpack bin), never str
        assert all(isinstance(k, bytes) for k in decoded.keys)
    for f in dataclasses.fields(decoded):
        value = getattr(decoded, f.name)
        if dataclasses.is_dataclass(getattr(message, f.name)):
            assert dataclasses.is_dataclass(value)


@pytest.mark.parametrize(
    "parts, problem",
    [
        ([], "empty"),
        ([b"\xc1not msgpack"], "undecodable"),
        ([msgpack.packb([1, 2])], "not a map"),
        ([msgpack.packb({"type": "nope"})], "unknown message type"),
        ([msgpack.packb({"type": "ping", "nonce": 1, "sent_at": 0.0, "num_frames": 1})], "extra frames"),
        ([msgpack.packb({"type": "ping", "nonce": 1})], "bad fields"),
        ([msgpack.packb({"type": "events", "events": {"type": "ping"}})], "not a list"),
        ([msgpack.packb({"type": "events", "events": [{"type": "nope"}]})], "unknown message type"),
        ([msgpack.packb({"type": "events", "events": [{"type": "token", "text": "x"}]})], "bad fields"),
        ([msgpack.packb({"type": "events", "events": [{"type": "events", "events": []}]})], "inside a batch"),
        ([msgpack.packb({"type": "add_request", "request_id": "x", "cache_breakpoints": ["5m"]})], "bad fields"),
        ([msgpack.packb({"type": "add_request", "request_id": "x",
                         "cache_breakpoints": [{"ttl_s": "5m"}]})], "bad fields"),
    ],
)
def test_bad_input_is_a_protocol_error(parts, problem) -> None:
    with pytest.raises(ProtocolError, match=problem):
        decode(parts)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    body = msgpack.packb({"type": "abort_request", "request_id": "x", "future_field": 1})
    message, _ = decode([body])
    assert message == AbortRequest("x")


def test_a_batch_keeps_each_event_whole_and_in_order() -> None:
    batch = EventBatch([TokenEvent("a", "x", [1]), FinishEvent("a", "stop", Usage(1, 1)), TokenEvent("b", "y", [2])])
    decoded, _ = decode([bytes(p) for p in encode(batch)])
    assert [type(e) for e in decoded.events] == [TokenEvent, FinishEvent, TokenEvent]
    assert isinstance(decoded.events[1].usage, Usage)
    assert decoded == batch
