"""mlxd's RMSNorm and RoPE kernels against MLX's own (the stock functions, captured by
tests/stock_mlx before anything installs the kernels): equal to float32 rounding, and a
row's result never depends on the rest of the batch."""

from __future__ import annotations

import sys

import pytest

mx = pytest.importorskip("mlx.core")

if mx.default_device().type != mx.DeviceType.cpu or sys.platform == "darwin":
    pytest.skip("the kernels serve MLX's CPU build", allow_module_level=True)

kernels = pytest.importorskip("worker._cpu_kernels", reason="kernels not built: run `make kernels`")

from tests.stock_mlx import rms_norm as stock_rms_norm  # noqa: E402  (after the skips: it imports MLX)
from tests.stock_mlx import rope as stock_rope  # noqa: E402


def _angle_tolerance(last_position: int) -> float:
    """Both compute the angle position * frequency in float32, whose rounding grows with
    the position (one ulp at 300 is 3e-5 rad), in their own order of operations."""
    return 4e-7 * (last_position + 10) + 1e-6


@pytest.mark.parametrize("shape", [(1, 1, 576), (3, 5, 576), (2, 7, 100), (4, 896)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_matches_mlx(shape: tuple[int, ...], with_weight: bool) -> None:
    x = mx.random.normal(shape, key=mx.random.key(1)) * 3
    weight = mx.random.normal((shape[-1],), key=mx.random.key(2)) if with_weight else None
    want = stock_rms_norm(x, weight, 1e-5)
    got = kernels.rms_norm(x, weight, 1e-5)
    assert mx.abs(want - got).max().item() < 1e-5


def test_rms_norm_row_alone_equals_batch() -> None:
    x = mx.random.normal((6, 1, 576), key=mx.random.key(3))
    weight = mx.ones((576,))
    batch = kernels.rms_norm(x, weight, 1e-6)
    assert mx.array_equal(kernels.rms_norm(x[4:5], weight, 1e-6), batch[4:5]).item()


@pytest.mark.parametrize("shape,offset", [
    ((1, 9, 1, 64), 300),  # decode
    ((1, 14, 40, 64), 0),  # prefill
    ((3, 2, 5, 128), 8000),  # far positions
])
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims_part", [1, 2])  # all of D, or its first half
def test_rope_matches_mlx(shape: tuple[int, ...], offset: int, traditional: bool, dims_part: int) -> None:
    x = mx.random.normal(shape, key=mx.random.key(4))
    dims = shape[-1] // dims_part
    want = stock_rope(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=offset)
    got = kernels.rope(x, dims, traditional=traditional, base=10000.0, scale=1.0,
                       offsets=mx.array([offset], dtype=mx.int32))
    assert mx.abs(want - got).max().item() < _angle_tolerance(offset + shape[-2])


def test_rope_with_one_offset_per_sequence() -> None:
    """A continuous batch rotates each sequence from its own position."""
    x = mx.random.normal((3, 4, 2, 64), key=mx.random.key(5))
    offsets = mx.array([0, 17, 250], dtype=mx.int32)
    got = kernels.rope(x, 64, traditional=False, base=1e6, scale=1.0, offsets=offsets)
    for b, start in enumerate((0, 17, 250)):
        want = stock_rope(x[b:b + 1], 64, traditional=False, base=1e6, scale=1.0, offset=start)
        assert mx.abs(want - got[b:b + 1]).max().item() < _angle_tolerance(start + 2)
        alone = kernels.rope(x[b:b + 1], 64, traditional=False, base=1e6, scale=1.0,
                             offsets=mx.array([start], dtype=mx.int32))
        assert mx.array_equal(alone, got[b:b + 1]).item()


def test_a_wrong_position_changes_the_output() -> None:
    x = mx.random.normal((1, 2, 1, 64), key=mx.random.key(6))
    one = kernels.rope(x, 64, traditional=False, base=1e4, scale=1.0, offsets=mx.array([10], dtype=mx.int32))
    other = kernels.rope(x, 64, traditional=False, base=1e4, scale=1.0, offsets=mx.array([11], dtype=mx.int32))
    assert mx.abs(one - other).max().item() > 1e-2
