"""GGUF quantized blocks repacked as MLX affine quantization: the exact formats give
llama.cpp's values bit for bit (gguf-py's reference decoders are the judge), and the
8-bit requantization of the others stays within half a step of its group."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize

from models.gguf_repack import EXACT_BITS, requantize_8bit, repack_exact

# Byte offsets of each format's fp16 fields (scale d, and the minimum or dmin where it has one).
HALF_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q8_0: (0,), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2),
}


def random_rows(qtype: Q, num_rows: int, values_per_row: int, seed: int = 0) -> np.ndarray:
    """Rows of random blocks: random bytes everywhere (every bit pattern of the packed
    values and sub-scales is legal) except the fp16 fields, which get finite values."""
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    num_blocks = values_per_row // block_values
    raw = rng.integers(0, 256, size=(num_rows, num_blocks, block_bytes), dtype=np.uint8)
    for offset in HALF_FIELDS[qtype]:
        halves = rng.uniform(-0.05, 0.05, size=(num_rows, num_blocks)).astype(np.float16)
        raw[..., offset:offset + 2] = halves.view(np.uint8).reshape(num_rows, num_blocks, 2)
    return raw.reshape(num_rows, num_blocks * block_bytes)


@pytest.mark.parametrize("qtype", sorted(EXACT_BITS, key=lambda t: t.value), ids=lambda t: t.name)
def test_exact_formats_equal_gguf_reference(qtype: Q) -> None:
    rows = random_rows(qtype, 6, 512)
    weight, scales, biases = repack_exact(rows, qtype)
    bits = EXACT_BITS[qtype]
    assert weight.dtype == np.uint32 and weight.shape == (6, 512 * bits // 32)
    ours = mx.dequantize(mx.array(weight), mx.array(scales).astype(mx.float32), mx.array(biases).astype(mx.float32),
                         group_size=32, bits=bits)
    want = gguf_dequantize(rows, qtype).reshape(6, 512)
    np.testing.assert_array_equal(np.array(ours), want)


def test_k_quant_scales_stay_float32() -> None:
    """d * sub-scale needs 17 bits of mantissa: float16 would round it."""
    for qtype in (Q.Q4_K, Q.Q5_K):
        _, scales, biases = repack_exact(random_rows(qtype, 2, 256), qtype)
        assert scales.dtype == np.float32 and biases.dtype == np.float32


def test_a_perturbed_byte_changes_the_values() -> None:
    """The comparison above can fail: one flipped nibble moves one value."""
    rows = random_rows(Q.Q4_K, 1, 256, seed=3)
    before = repack_exact(rows, Q.Q4_K)
    rows[0, 16 + 5] ^= 0x01
    after = repack_exact(rows, Q.Q4_K)
    assert not np.array_equal(before[0], after[0])


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda t: t.name)
def test_requantized_formats_stay_within_half_a_step(qtype: Q) -> None:
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(4, 2, block_bytes), dtype=np.uint8)
    d = rng.uniform(0.001, 0.01, size=(4, 2)).astype(np.float16).view(np.uint8).reshape(4, 2, 2)
    # d (and dmin) are the last fp16 fields of these super-blocks
    raw[..., block_bytes - 2:] = d
    if qtype == Q.Q2_K:
        raw[..., block_bytes - 4:block_bytes - 2] = d
    rows = raw.reshape(4, -1)
    values = gguf_dequantize(rows, qtype).reshape(4, -1)
    (weight, scales, biases), error = requantize_8bit(values)
    restored = np.array(mx.dequantize(mx.array(weight), mx.array(scales), mx.array(biases), group_size=32, bits=8))
    assert np.abs(restored - values).max() <= error + 1e-7
    groups = values.reshape(4, -1, 32)
    half_step = (groups.max(-1) - groups.min(-1)) / 255 / 2
    per_group = np.abs(restored - values).reshape(4, -1, 32).max(-1)
    assert np.all(per_group <= half_step * 1.001 + 1e-8)
    assert error > 0  # a 16-value format never fits 8-bit groups of 32 exactly here
