"""GGUF quantized blocks as MLX affine quantization (`value = scale * q + bias` per group of
32 values, q packed into uint32 words), without dequantizing.

Every format here maps exactly and keeps its width: Q4_0/Q4_1/Q4_K as 4-bit, Q8_0 as
8-bit, Q5_0/Q5_1/Q5_K as 5-bit (MLX's bit-stream layout, which mlxd's CPU kernels
multiply in place). The K-quants' group scales are
d * sub-scale products of an fp16 and a 6-bit integer: exact in float32, not in float16,
so they are stored as float32. Formats with 16-value sub-blocks (Q6_K, Q3_K, Q2_K) have
no exact group-32 form; `requantize_8bit` handles them (gguf_tensors measures the error).
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType

GROUP_SIZE = 32  # values per MLX group here: every format's (sub-)block of 32

# bits of the MLX layout each exactly-mapped block type becomes
EXACT_BITS: dict[GGMLQuantizationType, int] = {
    GGMLQuantizationType.Q4_0: 4,
    GGMLQuantizationType.Q4_1: 4,
    GGMLQuantizationType.Q8_0: 8,
    GGMLQuantizationType.Q4_K: 4,
    GGMLQuantizationType.Q5_0: 5,
    GGMLQuantizationType.Q5_1: 5,
    GGMLQuantizationType.Q5_K: 5,
}

Affine = tuple[np.ndarray, np.ndarray, np.ndarray]  # packed uint32 weight, scales, biases


def _pack_affine(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned `bits`-wide values (rows, n) into MLX's little-endian uint32 words:
    4-bit two to a byte, 8-bit one a byte, 5-bit as a bit stream (eight values in five
    bytes, value i at bits 5i..5i+4)."""
    if bits == 4:
        values = values[..., 0::2] | (values[..., 1::2] << 4)
    elif bits == 5:
        eights = values.astype(np.uint64).reshape(*values.shape[:-1], -1, 8)
        words = np.bitwise_or.reduce(eights << (np.arange(8, dtype=np.uint64) * 5), axis=-1)
        values = words[..., None].view(np.uint8)[..., :5].reshape(*values.shape[:-1], -1)
    flat = np.ascontiguousarray(values.astype(np.uint8))
    return flat.reshape(flat.shape[0], -1).view(np.uint32)


def _half(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 at byte `offset` of every block, as float16 (blocks, ...)."""
    return blocks[..., offset:offset + 2].copy().view(np.float16)[..., 0]


def _legacy(blocks: np.ndarray, tensor_type: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q values (rows, blocks, 32), scale, bias) of the 32-value formats."""
    if tensor_type == GGMLQuantizationType.Q8_0:
        scale = _half(blocks, 0)
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q, scale, (scale * -128).astype(np.float16)
    if tensor_type in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        first = 2 if tensor_type == GGMLQuantizationType.Q4_0 else 4
        packed = blocks[..., first:]
        # A block keeps values 0..15 in the low nibbles and 16..31 in the high ones.
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        scale = _half(blocks, 0)
        bias = (scale * -8).astype(np.float16) if first == 2 else _half(blocks, 2)
        return q, scale, bias
    # Q5_0: d, 32 high bits, 16 bytes of nibbles; Q5_1 adds the minimum after d.
    first = 2 if tensor_type == GGMLQuantizationType.Q5_0 else 4
    high = blocks[..., first:first + 4].copy().view("<u4")  # (rows, blocks, 1)
    bit = (high >> np.arange(32, dtype=np.uint32)) & 1
    packed = blocks[..., first + 4:]
    q = (np.concatenate([packed & 0x0F, packed >> 4], axis=-1) | (bit << 4).astype(np.uint8)).astype(np.uint8)
    scale = _half(blocks, 0)
    bias = (scale * -16).astype(np.float16) if first == 2 else _half(blocks, 2)
    return q, scale, bias


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit sub-block scales and minimums of a Q4_K/Q5_K super-block."""
    low, mid, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([low & 0x3F, (top & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    minimums = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return scales, minimums


def _k_quant(blocks: np.ndarray, tensor_type: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q (rows, blocks, 8, 32), scale, bias (rows, blocks, 8)) of Q4_K/Q5_K: 256 values
    per super-block in eight groups of 32, value = d * sc * q - dmin * m."""
    d = _half(blocks, 0).astype(np.float32)[..., None]
    dmin = _half(blocks, 2).astype(np.float32)[..., None]
    sub_scales, sub_minimums = _k_scales(blocks[..., 4:16])
    if tensor_type == GGMLQuantizationType.Q4_K:
        packed = blocks[..., 16:144]
    else:
        packed = blocks[..., 48:176]
    rows, num_blocks = blocks.shape[:2]
    # Each 32 bytes hold two groups: low nibbles first, then high nibbles.
    chunks = packed.reshape(rows, num_blocks, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (chunks & 0x0F).reshape(rows, num_blocks, 8, 32)
    if tensor_type == GGMLQuantizationType.Q5_K:
        high = blocks[..., 16:48].reshape(rows, num_blocks, 1, 32)
        q = q | (((high >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1) << 4)
    scale = d * sub_scales.astype(np.float32)
    bias = -(dmin * sub_minimums.astype(np.float32))
    return q.astype(np.uint8), scale, bias


_BLOCK_BYTES = {
    GGMLQuantizationType.Q4_0: 18,
    GGMLQuantizationType.Q4_1: 20,
    GGMLQuantizationType.Q8_0: 34,
    GGMLQuantizationType.Q5_0: 22,
    GGMLQuantizationType.Q5_1: 24,
    GGMLQuantizationType.Q4_K: 144,
    GGMLQuantizationType.Q5_K: 176,
}


def repack_exact(rows: np.ndarray, tensor_type: GGMLQuantizationType) -> Affine:
    """Raw GGUF rows (one per output unit) of an EXACT_BITS type as MLX affine
    (weight, scales, biases), with scale * q + bias equal to llama.cpp's value."""
    if sys.byteorder != "little":
        raise ValueError("the GGUF repacker assumes a little-endian host")
    if tensor_type not in EXACT_BITS:
        raise ValueError(f"{tensor_type.name} has no exact MLX affine layout")
    num_rows = rows.shape[0]
    blocks = rows.reshape(num_rows, -1, _BLOCK_BYTES[tensor_type])
    if tensor_type in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K):
        q, scale, bias = _k_quant(blocks, tensor_type)
    else:
        q, scale, bias = _legacy(blocks, tensor_type)
    bits = EXACT_BITS[tensor_type]
    weight = _pack_affine(q.reshape(num_rows, -1), bits)
    return weight, scale.reshape(num_rows, -1), bias.reshape(num_rows, -1)


def repack_native(rows: np.ndarray, tensor_type: GGMLQuantizationType) -> Affine:
    """Q4_0/Q4_1/Q8_0 rows as MLX affine arrays (kept for callers of the first importer)."""
    if tensor_type not in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
        raise ValueError(f"{tensor_type.name} is not an MLX-native block type")
    return repack_exact(rows, tensor_type)


def requantize_8bit(values: np.ndarray) -> tuple[Affine, float]:
    """Float rows as 8-bit affine groups of 32 (min/max per group, float32 scales), and
    the largest absolute difference of the result from `values`."""
    rows, width = values.shape
    groups = values.astype(np.float32).reshape(rows, width // GROUP_SIZE, GROUP_SIZE)
    low = groups.min(axis=-1, keepdims=True)
    high = groups.max(axis=-1, keepdims=True)
    scale = (high - low) / np.float32(255)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.clip(np.rint((groups - low) / safe), 0, 255).astype(np.uint8)
    restored = q.astype(np.float32) * scale + low
    error = float(np.abs(restored - groups).max()) if groups.size else 0.0
    weight = _pack_affine(q.reshape(rows, width), 8)
    return (weight, scale.reshape(rows, -1), low.reshape(rows, -1)), error
