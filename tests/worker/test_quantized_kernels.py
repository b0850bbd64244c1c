"""mlxd's quantized CPU matmul and gather against MLX's own affine quantization.

The weights stay packed; the activations become int16 per block of 32 (~15
bits): within ~1e-4 of the float product, and a token's bits never depend on the rest
of the batch, on the length of the segment it is computed in, or on which inner loop
(AVX2 or scalar) ran. That last property is what keeps a prefix-cache hit (which
computes a prompt's rest in other pieces) equal to a computation from scratch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

if mx.default_device().type != mx.DeviceType.cpu or sys.platform == "darwin":
    pytest.skip("the kernels serve MLX's CPU build", allow_module_level=True)

kernels = pytest.importorskip("worker._cpu_kernels", reason="kernels not built: run `make kernels`")


def _weights(n: int, k: int, bits: int, group_size: int, dtype: mx.Dtype, seed: int = 1) -> tuple[mx.array, ...]:
    w, scales, biases = mx.quantize(mx.random.normal((n, k), key=mx.random.key(seed)), group_size=group_size, bits=bits)
    return w, scales.astype(dtype), biases.astype(dtype)


def _float_weight(w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int) -> mx.array:
    return mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), group_size=group_size, bits=bits)


CASES = [
    (4, 32, mx.float16, 96),  # 3 blocks: an unpaired last block, fewer than 8
    (4, 32, mx.float16, 576),  # SmolLM2's hidden size
    (4, 64, mx.float32, 640),
    (4, 128, mx.float16, 896),
    (5, 32, mx.float16, 96),  # 5-bit: a 20-byte block, values crossing bytes
    (5, 32, mx.float32, 896),  # Qwen2.5-0.5B's hidden size (its Q5_0 layers)
    (5, 64, mx.float16, 640),
    (5, 128, mx.float32, 1024),
    (8, 32, mx.float16, 576),
    (8, 64, mx.float32, 320),
    (8, 128, mx.float32, 1024),
]


@pytest.mark.parametrize("bits,group_size,dtype,k", CASES)
@pytest.mark.parametrize("tokens", [1, 3, 8, 9, 40])
def test_matches_the_float_product(bits: int, group_size: int, dtype: mx.Dtype, k: int, tokens: int) -> None:
    w, scales, biases = _weights(72, k, bits, group_size, dtype)
    x = mx.random.normal((2, tokens, k), key=mx.random.key(tokens))
    want = x @ _float_weight(w, scales, biases, group_size, bits).T
    got = kernels.quantized_matmul(x, w, scales, biases, group_size=group_size, bits=bits)
    assert got.shape == want.shape and got.dtype == mx.float32
    error = mx.abs(got - want).max().item() / mx.abs(want).max().item()
    assert error < 1e-3, error


@pytest.mark.parametrize("bits,group_size,dtype,k", CASES)
def test_a_decode_row_has_the_same_bits_in_any_batch(bits: int, group_size: int, dtype: mx.Dtype, k: int) -> None:
    w, scales, biases = _weights(40, k, bits, group_size, dtype)
    batch = mx.random.normal((7, 1, k), key=mx.random.key(5))  # 7 sequences decoding one token each
    together = kernels.quantized_matmul(batch, w, scales, biases, group_size=group_size, bits=bits)
    for row in (0, 3, 6):
        alone = kernels.quantized_matmul(batch[row:row + 1], w, scales, biases, group_size=group_size, bits=bits)
        assert mx.array_equal(alone, together[row:row + 1]).item(), row
    prefill = mx.random.normal((2, 30, k), key=mx.random.key(6))
    both = kernels.quantized_matmul(prefill, w, scales, biases, group_size=group_size, bits=bits)
    one = kernels.quantized_matmul(prefill[1:], w, scales, biases, group_size=group_size, bits=bits)
    assert mx.array_equal(one, both[1:]).item()
    # a prompt's last token alone (as a decode step computes it) and the rest of a
    # prompt after a cache hit give the bits the full segment gives
    last = kernels.quantized_matmul(prefill[1:, -1:], w, scales, biases, group_size=group_size, bits=bits)
    assert mx.array_equal(last, both[1:, -1:]).item()
    rest = kernels.quantized_matmul(prefill[:, 25:], w, scales, biases, group_size=group_size, bits=bits)
    assert mx.array_equal(rest, both[:, 25:]).item()


def test_a_changed_weight_changes_the_output() -> None:
    """The comparisons above can fail: one flipped nibble moves the outputs of its row."""
    w, scales, biases = _weights(16, 576, 4, 32, mx.float16)
    x = mx.random.normal((1, 1, 576), key=mx.random.key(2))
    before = kernels.quantized_matmul(x, w, scales, biases, group_size=32, bits=4)
    flipped = np.array(w)
    flipped[5, 3] ^= 0x10
    after = kernels.quantized_matmul(x, mx.array(flipped), scales, biases, group_size=32, bits=4)
    changed = np.nonzero(np.array(before != after)[0, 0])[0].tolist()
    assert changed == [5]


@pytest.mark.parametrize("bits,group_size,dtype,k", CASES[:9])
def test_gather_equals_dequantized_rows(bits: int, group_size: int, dtype: mx.Dtype, k: int) -> None:
    w, scales, biases = _weights(50, k, bits, group_size, dtype)
    ids = mx.array([[3, 49, 0], [3, 7, 12]])
    want = _float_weight(w, scales, biases, group_size, bits)[ids]
    got = kernels.quantized_gather(w, scales, biases, ids, group_size=group_size, bits=bits)
    assert got.shape == (2, 3, k) and mx.abs(got - want).max().item() < 1e-6


@pytest.mark.parametrize("bits,group_size,dtype,k", CASES)
@pytest.mark.parametrize("panel_rows", [8, 16])
def test_panels_give_the_same_bits(bits: int, group_size: int, dtype: mx.Dtype, k: int, panel_rows: int) -> None:
    """Panels only move bytes (each block of 8 or 16 rows stored as the vector loop cuts
    it): every output, for every batch shape, and the gather are bit for bit what MLX's
    layout gives (which the scalar loop reads)."""
    w, scales, biases = _weights(80, k, bits, group_size, dtype)
    panels = kernels.quantized_panels(w, scales, biases, group_size=group_size, bits=bits, panel_rows=panel_rows)
    assert panels[0].shape == (80 // panel_rows, w.shape[1] * panel_rows)
    assert panels[1].shape == scales.shape and panels[1].dtype == scales.dtype
    assert not mx.array_equal(panels[0].reshape(w.shape), w).item()  # the bytes did move
    for tokens in (1, 5, 70):
        x = mx.random.normal((tokens, k), key=mx.random.key(tokens))
        plain = kernels.quantized_matmul(x, w, scales, biases, group_size=group_size, bits=bits)
        assert mx.array_equal(kernels.quantized_matmul(x, *panels, group_size=group_size, bits=bits), plain).item()
    ids = mx.array([[0, 79, 5], [2, 3, 70]])
    assert mx.array_equal(kernels.quantized_gather(*panels, ids, group_size=group_size, bits=bits),
                          kernels.quantized_gather(w, scales, biases, ids, group_size=group_size, bits=bits)).item()


def test_a_changed_panel_byte_changes_its_row_only() -> None:
    """The panel comparison can fail: one flipped bit in a panel moves one output column."""
    w, scales, biases = _weights(32, 576, 5, 32, mx.float16)
    panels = list(kernels.quantized_panels(w, scales, biases, group_size=32, bits=5, panel_rows=16))
    x = mx.random.normal((1, 576), key=mx.random.key(2))
    before = kernels.quantized_matmul(x, *panels, group_size=32, bits=5)
    flipped = np.array(panels[0])
    flipped[1, 0] ^= 0x1  # panel 1 (rows 16-31), first word: bit 0 of row 16's value 0
    panels[0] = mx.array(flipped)
    after = kernels.quantized_matmul(x, *panels, group_size=32, bits=5)
    assert np.nonzero(np.array(before != after)[0])[0].tolist() == [16]


def test_mlx_refuses_panels_rather_than_misread_them() -> None:
    from tests.stock_mlx import quantized_matmul as _stock_quantized_matmul

    w, scales, biases = _weights(16, 64, 4, 32, mx.float16)
    panels = kernels.quantized_panels(w, scales, biases, group_size=32, bits=4, panel_rows=16)
    with pytest.raises(ValueError):
        mx.eval(_stock_quantized_matmul(mx.zeros((1, 64)), *panels[:1], scales=panels[1], biases=panels[2],
                                        transpose=True, group_size=32, bits=4))


def test_bad_layouts_are_refused() -> None:
    w, scales, biases = _weights(8, 64, 4, 32, mx.float16)
    x = mx.zeros((1, 64))
    with pytest.raises(ValueError, match="bits"):
        kernels.quantized_matmul(x, w, scales, biases, group_size=32, bits=3)
    with pytest.raises(ValueError, match="last axis"):
        kernels.quantized_matmul(mx.zeros((1, 63)), w, scales, biases, group_size=32, bits=4)
    with pytest.raises(ValueError, match="float32"):
        kernels.quantized_matmul(x.astype(mx.float16), w, scales, biases, group_size=32, bits=4)


_SCALAR_CHECK = """
import sys
import numpy as np
import mlx.core as mx
from worker import _cpu_kernels as kernels
out = []
for bits, group_size, k in ((4, 32, 96), (4, 64, 640), (5, 32, 896), (5, 128, 640), (8, 32, 576), (8, 128, 1024)):
    w, s, b = mx.quantize(mx.random.normal((33, k), key=mx.random.key(1)), group_size=group_size, bits=bits)
    x = mx.random.normal((7, 1, k), key=mx.random.key(2))
    out.append(np.array(kernels.quantized_matmul(x, w, s.astype(mx.float16), b.astype(mx.float16),
                                                 group_size=group_size, bits=bits)))
    for panel_rows in (8, 16):  # and in panels, as a loaded model's weights are (33 rows: the first 32)
        panels = kernels.quantized_panels(w[:32], s[:32].astype(mx.float16), b[:32].astype(mx.float16),
                                        group_size=group_size, bits=bits, panel_rows=panel_rows)
        out.append(np.array(kernels.quantized_matmul(x, *panels, group_size=group_size, bits=bits)))
np.save(sys.argv[1], np.concatenate([o.reshape(-1) for o in out]))
print(kernels.quantized_isa())
"""


SIMD_LOOPS = ("avx512-vnni", "avx-vnni", "avx2")


def run_loop(isa: str, path: Path) -> tuple[str, np.ndarray]:
    """The outputs of the check's matmuls with MLXD_QUANTIZED_ISA=`isa`, and the loop that ran
    (a CPU without `isa` runs the next narrower one)."""
    env = {**os.environ, "MLXD_QUANTIZED_ISA": isa}
    run = subprocess.run([sys.executable, "-c", _SCALAR_CHECK, str(path)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), np.load(path)


@pytest.fixture(scope="module")
def scalar_outputs(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    ran, outputs = run_loop("scalar", tmp_path_factory.mktemp("scalar") / "scalar.npy")
    assert ran == "scalar"
    return outputs


@pytest.mark.parametrize("isa", SIMD_LOOPS)
def test_inner_loop_matches_the_scalar_loop(isa: str, scalar_outputs: np.ndarray, tmp_path: Path) -> None:
    """The AVX-512 VNNI loop, the AVX-VNNI loop and the AVX2 loop each give the scalar
    fallback's bits, so the prefix-cache fingerprint need not tell them apart. Each is forced
    with MLXD_QUANTIZED_ISA and must be the loop that ran; a loop this CPU cannot run is a
    skip that names the loop, so the report shows which loops were compared."""
    ran, outputs = run_loop(isa, tmp_path / f"{isa}.npy")
    assert ran == "scalar" or SIMD_LOOPS.index(ran) >= SIMD_LOOPS.index(isa), (isa, ran)  # never wider
    if ran != isa:
        pytest.skip(f"this CPU lacks {isa} (it ran {ran})")
    np.testing.assert_array_equal(scalar_outputs, outputs, err_msg=isa)


def test_the_best_loop_is_the_widest_the_cpu_has() -> None:
    best = kernels.quantized_isa()
    assert best in (*SIMD_LOOPS, "scalar")
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # Linux: a CPU with AVX2 never falls back to the scalar loop
        flags = set(re.findall(r"[a-z0-9_]+", cpuinfo.read_text()))
        assert (best != "scalar") == ({"avx2", "fma", "f16c"} <= flags), best


def test_installed_kernels_serve_quantized_layers() -> None:
    code = """
import mlx.core as mx
import mlx.nn as nn
from worker.cpu_kernels import install
print(install())
linear = nn.QuantizedLinear(256, 48, bias=True, group_size=64, bits=4)
embedding = nn.QuantizedEmbedding(100, 256, group_size=32, bits=8)
x = mx.random.normal((1, 1, 256))
assert mx.quantized_matmul.__module__ == "worker.cpu_kernels"
want = x @ mx.dequantize(linear.weight, linear.scales, linear.biases, group_size=64, bits=4).T + linear.bias
assert mx.abs(linear(x) - want).max().item() / mx.abs(want).max().item() < 1e-2
ids = mx.array([[1, 99]])
rows = mx.dequantize(embedding.weight, embedding.scales, embedding.biases, group_size=32, bits=8)[ids]
assert mx.abs(embedding(ids) - rows).max().item() < 1e-6
odd = nn.QuantizedLinear(256, 48, group_size=64, bits=3)  # not served: MLX's own op still runs it
assert odd(x).shape == (1, 1, 48)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert any(f"quantized {isa})" in result.stdout for isa in ("avx512-vnni", "avx-vnni", "avx2", "scalar")), result.stdout


def test_loaded_layers_go_into_panels_of_a_height_that_divides_them() -> None:
    """16-row panels where the rows allow (AVX-512), 8-row ones where only 8 divides them,
    MLX's layout otherwise; the outputs are the same bits in all three."""
    code = """
import mlx.core as mx
import mlx.nn as nn
from worker import _cpu_kernels as kernels
from worker.cpu_kernels import install, pack_quantized_panels

install()  # the kernels compute `want` too (MLX's own op rounds otherwise)
model = nn.Sequential(nn.QuantizedLinear(256, 48, group_size=32, bits=5), nn.QuantizedLinear(256, 24, group_size=32, bits=4),
                      nn.QuantizedLinear(256, 20, group_size=32, bits=8))
x = mx.random.normal((3, 256))
want = [layer(x) for layer in model.layers]
shapes = [layer.weight.shape for layer in model.layers]
assert pack_quantized_panels(model) == 2
height = kernels.quantized_panel_rows()
assert model.layers[0].weight.shape == (48 // height, shapes[0][1] * height)
assert model.layers[1].weight.shape == (3, shapes[1][1] * 8)
assert model.layers[2].weight.shape == shapes[2]  # 20 rows: left as MLX stores them
assert all(mx.array_equal(layer(x), w).item() for layer, w in zip(model.layers, want))
"""
    if kernels.quantized_panel_rows() == 1:
        pytest.skip("this CPU runs the scalar loop only: nothing goes into panels")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
