"""Block payloads as bytes, for the SSD cold tier (the kvstore stores opaque bytes).

Layout: 4-byte little-endian header length, a msgpack header (format version, one entry
per layer: kind, array shapes and dtypes, snapshot scalars), then the raw array bytes in
order. Anything that does not parse back exactly raises `ValueError`: the caller treats
the block as a miss, never as KV.
"""

from __future__ import annotations

import struct

import mlx.core as mx
import msgpack
import numpy as np

from worker.kv_blocks import BlockPayload, LayerBlock

FORMAT_VERSION = 1

# MLX dtypes <-> a numpy dtype of the same width that carries the raw bits
_RAW = {
    "float32": (mx.float32, np.float32),
    "float16": (mx.float16, np.float16),
    "bfloat16": (mx.uint16, np.uint16),  # no numpy bfloat16: move the bits as uint16
    "int32": (mx.int32, np.int32),
    "int64": (mx.int64, np.int64),
    "uint32": (mx.uint32, np.uint32),
    "uint8": (mx.uint8, np.uint8),
    "bool": (mx.bool_, np.bool_),
}


def _dtype_name(a: mx.array) -> str:
    return str(a.dtype).removeprefix("mlx.core.")


def encode_block(payload: BlockPayload) -> bytes:
    layers, chunks = [], []
    for layer in payload.layers:
        arrays = []
        for a in layer.arrays:
            name = _dtype_name(a)
            if name not in _RAW:
                raise ValueError(f"cannot store a {name} array in the cold tier")
            raw = a.view(_RAW[name][0]) if name == "bfloat16" else a
            chunks.append(memoryview(raw).cast("B"))  # joined below: the only copy
            arrays.append([list(a.shape), name])
        layers.append({"kind": layer.kind, "arrays": arrays, "scalars": list(layer.scalars)})
    header = msgpack.packb({"v": FORMAT_VERSION, "layers": layers, "nbytes": payload.nbytes})
    return b"".join([struct.pack("<I", len(header)), header, *chunks])


def decode_block(data: bytes | memoryview) -> BlockPayload:
    view = memoryview(data)
    try:
        (header_len,) = struct.unpack_from("<I", view, 0)
        header = msgpack.unpackb(view[4 : 4 + header_len], strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"unreadable block header: {exc}") from exc
    if not isinstance(header, dict) or header.get("v") != FORMAT_VERSION:
        raise ValueError("unknown block format version")
    offset = 4 + header_len
    layers = []
    for entry in header["layers"]:
        arrays = []
        for shape, name in entry["arrays"]:
            mx_raw, np_raw = _RAW[name]
            count = int(np.prod(shape)) if shape else 1
            size = count * np.dtype(np_raw).itemsize
            if offset + size > len(view):
                raise ValueError("block payload shorter than its header says")
            flat = np.frombuffer(view[offset : offset + size], dtype=np_raw).reshape(shape)
            array = mx.array(flat)
            arrays.append(array.view(mx.bfloat16) if name == "bfloat16" else array)
            offset += size
        scalars = tuple(entry["scalars"])
        layers.append(LayerBlock(entry["kind"], tuple(arrays), scalars))
    if offset != len(view):
        raise ValueError("block payload longer than its header says")
    return BlockPayload(tuple(layers), int(header["nbytes"]))
