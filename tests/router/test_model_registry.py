"""The router's estimate of a model's weights once loaded: quantized layers the CPU
worker serves as they are count at their stored size, everything else as float32."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from router.model_registry import estimate_weights_bytes

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="macOS serves checkpoints as stored")


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A header-only safetensors file (the estimate reads nothing else) with zero data."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        numel = 1
        for d in shape:
            numel *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + numel * sizes[dtype]]}
        offset += numel * sizes[dtype]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_served_layouts_count_as_stored_and_others_as_float32(tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "model.safetensors", {
        "q.weight": ("U32", [64, 32]),  # 4-bit g32: 64 x 256 values
        "q.scales": ("F16", [64, 8]),
        "q.biases": ("F16", [64, 8]),
        "e.weight": ("U32", [10, 64]),  # 8-bit g32, bfloat16 scales: widened to float32
        "e.scales": ("BF16", [10, 8]),
        "e.biases": ("BF16", [10, 8]),
        "odd.weight": ("U32", [8, 12]),  # 3-bit: not served, dequantized (8 x 128 values)
        "odd.scales": ("F16", [8, 2]),
        "odd.biases": ("F16", [8, 2]),
        "norm.weight": ("F16", [256]),  # floats are served as float32
    })
    config = {"quantization": {"group_size": 32, "bits": 4, "e": {"group_size": 32, "bits": 8},
                               "odd": {"group_size": 64, "bits": 3}}}
    kept = 64 * 32 * 4 + 2 * 64 * 8 * 2 + 10 * 64 * 4 + 2 * 10 * 8 * 4
    # exactly 32 / 3 values per word (it was floored to 10, which undercounted odd widths)
    dequantized_odd = 8 * 128 * 4
    assert estimate_weights_bytes(tmp_path, config) == kept + dequantized_odd + 256 * 4
    everything_fp32 = 64 * 256 * 4 + 10 * 64 * 4 * 4 + dequantized_odd + 256 * 4
    assert estimate_weights_bytes(tmp_path, config, dequantize_all=True) == everything_fp32
