"""mlxd's CPU attention, SwiGLU and logsumexp kernels against MLX's own ops (tests/stock_mlx:
captured before anything installs the kernels over them).

The kernels must agree with `mx.fast.scaled_dot_product_attention` to float32 rounding
in every mask form mlx-lm passes, and a row's result must be bit-identical whatever else
shares the batch (that is what keeps batched and cached answers equal to lone ones).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")

if mx.default_device().type != mx.DeviceType.cpu or sys.platform == "darwin":
    pytest.skip("the kernels serve MLX's CPU build", allow_module_level=True)

kernels = pytest.importorskip("worker._cpu_kernels", reason="kernels not built: run `make kernels`")

from tests import stock_mlx  # noqa: E402  (after the skips: it imports MLX)

TOL = 2e-5


def _normal(*shape: int, seed: int) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed))


def _qkv(b: int, hq: int, hkv: int, length: int, keys: int, dim: int) -> tuple[mx.array, mx.array, mx.array]:
    return _normal(b, hq, length, dim, seed=1), _normal(b, hkv, keys, dim, seed=2), _normal(b, hkv, keys, dim, seed=3)


def _max_err(a: mx.array, b: mx.array) -> float:
    return mx.abs(a - b).max().item()


@pytest.mark.parametrize(
    "shape",
    [
        (1, 9, 3, 1, 430, 64),  # decode, grouped-query
        (8, 9, 3, 1, 97, 64),  # batched decode
        (1, 9, 3, 300, 300, 64),  # prefill from scratch
        (1, 8, 2, 61, 700, 64),  # prefill after a prefix-cache hit
        (1, 14, 2, 45, 1300, 64),  # after a long context: keys in several blocks, row groups and a partial one
        (2, 4, 4, 5, 37, 128),  # multi-head, head dim 128
        (3, 6, 3, 7, 20, 32),  # odd sizes: keys not a multiple of the tile
    ],
)
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "additive"])
def test_attention_matches_mlx(shape: tuple[int, ...], mask: str) -> None:
    b, hq, hkv, length, keys, dim = shape
    q, k, v = _qkv(*shape)
    scale = dim**-0.5
    if mask == "none":
        want = stock_mlx.scaled_dot_product_attention(q, k, v, scale=scale)
        got = kernels.attention(q, k, v, scale=scale)
    elif mask == "causal":
        want = stock_mlx.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
        got = kernels.attention(q, k, v, scale=scale, causal=True)
    elif mask == "bool":
        keep = mx.random.uniform(shape=(b, 1, length, keys), key=mx.random.key(4)) > 0.3
        keep[..., 0] = True  # every row sees at least one key, as in real masks
        want = stock_mlx.scaled_dot_product_attention(q, k, v, scale=scale, mask=keep)
        got = kernels.attention(q, k, v, scale=scale, mask=keep)
    else:
        bias = _normal(length, keys, seed=5)
        want = stock_mlx.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias)
        got = kernels.attention(q, k, v, scale=scale, mask=bias)
    assert got.shape == want.shape
    assert _max_err(got, want) < TOL


def test_attention_reads_cache_views_and_transposed_queries() -> None:
    """mlx-lm hands over keys as slices of a larger cache buffer and queries transposed
    from (B, L, H, D); neither is contiguous."""
    k_buf, v_buf = _normal(2, 3, 256, 64, seed=6), _normal(2, 3, 256, 64, seed=7)
    k, v = k_buf[..., :150, :], v_buf[..., :150, :]
    q = _normal(2, 20, 9, 64, seed=8).transpose(0, 2, 1, 3)
    want = stock_mlx.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert _max_err(kernels.attention(q, k, v, scale=0.125, causal=True), want) < TOL
    # a strided last axis is copied, not misread
    k_t = _normal(1, 3, 64, 40, seed=9).swapaxes(-1, -2)
    v1 = _normal(1, 3, 40, 64, seed=10)
    q1 = _normal(1, 9, 1, 64, seed=11)
    want = stock_mlx.scaled_dot_product_attention(q1, k_t, v1, scale=0.125)
    assert _max_err(kernels.attention(q1, k_t, v1, scale=0.125), want) < TOL


def test_a_prefill_row_after_a_long_context_is_bit_identical_to_it_alone() -> None:
    """A warm agent turn prefills its new tokens after thousands of cached ones, in row
    groups that take the keys block by block; each row must come out as it would alone
    (its token decoded after the same keys), or cached answers would drift from uncached."""
    length, keys = 70, 1400
    q = _normal(1, 14, length, 64, seed=15)
    k, v = _normal(1, 2, keys, 64, seed=16), _normal(1, 2, keys, 64, seed=17)
    segment = kernels.attention(q, k, v, scale=0.125, causal=True)
    for i in (0, 31, 32, 69):
        visible = keys - length + i + 1
        alone = kernels.attention(q[:, :, i : i + 1], k[:, :, :visible], v[:, :, :visible], scale=0.125)
        assert mx.array_equal(segment[:, :, i : i + 1], alone).item(), f"row {i} differs"


def test_a_row_is_bit_identical_alone_and_in_a_batch() -> None:
    """Left-padded batch (as BatchKVCache builds it) against each sequence alone: exact."""
    lengths = [40, 23, 31, 9]
    keys = max(lengths)
    q = _normal(len(lengths), 9, 1, 64, seed=12)
    k, v = _normal(len(lengths), 3, keys, 64, seed=13), _normal(len(lengths), 3, keys, 64, seed=14)
    pad = mx.array([keys - n for n in lengths])
    keep = (mx.arange(keys)[None, :] >= pad[:, None]).reshape(len(lengths), 1, 1, keys)
    batched = kernels.attention(q, k, v, scale=0.125, mask=keep)
    for i, n in enumerate(lengths):
        alone = kernels.attention(q[i : i + 1], k[i : i + 1, :, keys - n :], v[i : i + 1, :, keys - n :], scale=0.125)
        assert mx.array_equal(batched[i : i + 1], alone).item(), f"row {i} differs"


def test_swiglu_matches_mlx() -> None:
    for rows in (1, 7, 300):
        gate = _normal(rows, 1536, seed=15) * 4
        up = _normal(rows, 1536, seed=16)
        want = gate * mx.sigmoid(gate) * up
        assert _max_err(kernels.swiglu(gate, up), want) < 1e-4
    extreme = mx.array([-1e4, -100.0, -88.0, -20.0, 0.0, 20.0, 88.0, 100.0])
    got = kernels.swiglu(extreme, mx.ones_like(extreme))
    want = extreme * mx.sigmoid(extreme)
    assert mx.all(mx.isfinite(got)).item()
    assert _max_err(got, want) < 1e-3


@pytest.mark.parametrize("shape", [(1, 49152), (8, 49152), (3, 5), (2, 3, 17), (1, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_matches_mlx(shape: tuple[int, ...], keepdims: bool) -> None:
    x = _normal(*shape, seed=17) * 8
    want = stock_mlx.logsumexp(x, axis=-1, keepdims=keepdims)
    got = kernels.logsumexp_last(x, keepdims=keepdims)
    assert got.shape == want.shape
    # Both sum the exponentials in their own order: measured here at most 2 ulps apart over
    # these shapes (7.6e-6 at 37.0 for (8, 49152); rows of up to 17 values bit-equal) and 5 over
    # (64, 49152), where MLX's own is the less exact (6 ulps from the float64 value, mlxd's 1.2)
    ulp = np.spacing(np.float32(max(1.0, mx.abs(want).max().item())))
    assert _max_err(got, want) <= 8 * ulp


def test_logsumexp_edge_rows() -> None:
    """Banned tokens (-inf), a row of -inf, +inf and NaN keep MLX's meaning."""
    inf, nan = float("inf"), float("nan")
    x = mx.array([
        [0.0, -inf, 1.0, -inf, 2.0, -inf, 3.0, -inf, 4.0, 5.0],
        [-inf] * 10,
        [0.0] * 9 + [inf],
        [0.0] * 4 + [nan] + [0.0] * 5,
        [-1e30, 1e30] + [0.0] * 8,
    ])
    got = kernels.logsumexp_last(x).tolist()
    want = stock_mlx.logsumexp(x, axis=-1).tolist()
    assert got[0] == pytest.approx(want[0], abs=1e-5)
    assert got[1] == -inf and got[2] == inf
    assert got[3] != got[3]  # NaN
    assert got[4] == pytest.approx(1e30)


def test_logsumexp_row_is_bit_identical_alone_and_in_a_batch() -> None:
    rows = _normal(8, 49152, seed=18) * 5
    batch = kernels.logsumexp_last(rows)
    for i in (0, 5):
        assert kernels.logsumexp_last(rows[i : i + 1]).item() == batch[i].item()


def test_bad_shapes_are_rejected_not_misread() -> None:
    q, k, v = _qkv(1, 4, 3, 2, 5, 16)  # 4 query heads over 3 kv heads
    with pytest.raises(ValueError):
        kernels.attention(q, k, v, scale=0.25)
    q, k, v = _qkv(1, 2, 2, 2, 5, 12)  # head dim not a multiple of 8
    with pytest.raises(ValueError):
        kernels.attention(q, k, v, scale=0.25)
    with pytest.raises(ValueError):
        kernels.swiglu(mx.zeros((3,)), mx.zeros((4,)))
    with pytest.raises(ValueError):
        kernels.logsumexp_last(mx.zeros((3, 4), dtype=mx.float16))


def test_install_routes_mlx_lm_models_and_keeps_other_dtypes_on_mlx() -> None:
    """In a fresh interpreter (installing patches mlx-lm's modules for the process)."""
    code = """
import mlx.core as mx
import mlx_lm.models.llama as llama
from mlx_lm.models import base
from worker.cpu_kernels import install
print(install())
assert llama.scaled_dot_product_attention is base.scaled_dot_product_attention
assert llama.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
q = mx.random.normal((1, 4, 3, 16)).astype(mx.float16)
out = llama.scaled_dot_product_attention(q, q, q, cache=None, scale=0.25, mask="causal")
assert out.dtype == mx.float16  # half precision goes to MLX's own kernel
q32 = q.astype(mx.float32)
want = mx.fast.scaled_dot_product_attention(q32, q32, q32, scale=0.25, mask="causal")
got = llama.scaled_dot_product_attention(q32, q32, q32, cache=None, scale=0.25, mask="causal")
assert mx.abs(want - got).max().item() < 1e-5
logits = mx.random.normal((8, 1000))
assert mx.logsumexp.__module__ == "worker.cpu_kernels"  # BatchGenerator's call now reaches the kernel
assert mx.abs(mx.logsumexp(logits, axis=-1, keepdims=True)
              - mx.log(mx.sum(mx.exp(logits), axis=-1, keepdims=True))).max().item() < 1e-5
assert mx.logsumexp(logits).shape == ()  # other axes go to MLX's own op
assert mx.logsumexp(logits, axis=0).shape == (1000,)
assert mx.logsumexp(logits.astype(mx.float16), axis=-1).dtype == mx.float16
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("mlxd-cpu-7 ("), result.stdout


def test_cache_fingerprint_names_the_kernels(tmp_path) -> None:
    from worker.model_loader import model_fingerprint

    (tmp_path / "config.json").write_text("{}")
    stock = model_fingerprint(tmp_path, "float32", "mlx")
    ours = model_fingerprint(tmp_path, "float32", "mlxd-cpu-7 (2 threads, quantized avx2)")
    assert stock != ours
    assert ours == model_fingerprint(tmp_path, "float32", "mlxd-cpu-7 (8 threads, quantized avx2)")
    assert ours != model_fingerprint(tmp_path, "float32", "mlxd-cpu-1 (2 threads)")
    # a model served with its 4-bit layers kept never reads the blocks of its fp32 twin
    kept = model_fingerprint(tmp_path, "float32", "mlxd-cpu-7 (2 threads)", "4-bit g32: 210 layers")
    assert kept != ours


def test_gelu_is_erf_gelu_and_position_free() -> None:
    """BERT's exact GELU: within 1e-6 of MLX's erf form over a wide range, and an
    element's bits do not depend on where it lies (a tail is padded, not looped)."""
    x = mx.concatenate([mx.random.normal((4099,), key=mx.random.key(7)) * 4, mx.array([0.0, -40.0, 40.0, 1e-20])])
    got = kernels.gelu(x)
    assert mx.abs(got - nn.gelu(x)).max().item() < 1e-6
    assert mx.array_equal(kernels.gelu(x[4096:]), got[4096:]).item()  # the array's tail alone
    assert mx.array_equal(kernels.gelu(x[5:13]), got[5:13]).item()
    assert not mx.array_equal(kernels.gelu(x + 1e-3), got).item()  # the comparison can fail
