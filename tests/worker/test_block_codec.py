"""Block payloads survive the trip to bytes exactly; damaged bytes are refused."""

from __future__ import annotations

import mlx.core as mx
import pytest

from worker.block_codec import decode_block, encode_block
from worker.kv_blocks import SLICE, SNAPSHOT, BlockPayload, LayerBlock


def payload(dtype) -> BlockPayload:
    mx.random.seed(1)
    k = mx.random.normal((1, 3, 8, 4)).astype(dtype)
    v = mx.random.normal((1, 3, 8, 4)).astype(dtype)
    snap = LayerBlock(SNAPSHOT, (mx.random.normal((1, 5)).astype(dtype), mx.array([3, 4], dtype=mx.int32)),
                      (["t", [["a", 0], ["s", 17], ["l", [["a", 1], ["s", None]]]]],))
    layers = (LayerBlock(SLICE, (k, v)), snap)
    return BlockPayload(layers, sum(a.nbytes for layer in layers for a in layer.arrays))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_round_trip_is_exact(dtype) -> None:
    original = payload(dtype)
    restored = decode_block(encode_block(original))
    assert restored.nbytes == original.nbytes
    for a_layer, b_layer in zip(original.layers, restored.layers):
        assert (a_layer.kind, a_layer.scalars) == (b_layer.kind, b_layer.scalars)
        for a, b in zip(a_layer.arrays, b_layer.arrays):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert mx.array_equal(a, b).item()


@pytest.mark.parametrize("damage", ["truncate", "extend", "header"])
def test_damaged_bytes_are_refused(damage) -> None:
    data = encode_block(payload(mx.float32))
    bad = {"truncate": data[:-3], "extend": data + b"\x00", "header": b"\xff\xff\xff\x7f" + data[4:]}[damage]
    with pytest.raises(ValueError):
        decode_block(bad)
