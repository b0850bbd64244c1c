"""The references the kernel tests compare with (tests/stock_mlx) are MLX's own ops, even in
a session where a test has loaded a model in-process and so installed mlxd's kernels over
`mx.logsumexp` and the rest: otherwise a kernel test would compare the kernel with itself
(bit-equal) where MLX's own op differs (logsumexp over SmolLM2's 49,152 logits: up to
2 ulps, 7.6e-6)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from tests import stock_mlx  # noqa: E402  (after the skip: it imports MLX)
from tests.worker import stock_op_outputs  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_each_reference_is_mlxs_own_function() -> None:
    """Compiled MLX functions (nanobind), not Python closures; where mlxd's replacement is
    installed now, it falls back to exactly the op the tests compare with."""
    for name, (stock, owner, attribute) in stock_mlx.OPS.items():
        if name == "quantized_embedding_call":
            assert (stock.__module__, stock.__qualname__) == ("mlx.nn.layers.quantized", "QuantizedEmbedding.__call__")
        else:
            assert type(stock).__name__ == "nb_func", (name, stock)
            assert stock.__module__ in ("mlx.core", "mlx.core.fast") and stock.__name__ == attribute, (name, stock)
        live = getattr(owner, attribute)
        if live is not stock:
            assert live.__module__ == "worker.cpu_kernels", (name, live)
            assert inspect.unwrap(live) is stock, name


def test_each_reference_gives_the_bits_of_a_process_without_mlxd(tmp_path: Path) -> None:
    """Bit for bit what MLX computes in a process that never imported mlxd: a reference
    that were mlxd's kernel (or off by one ulp anywhere) fails here."""
    inputs = stock_op_outputs.make_inputs()
    np.savez(tmp_path / "inputs.npz", **inputs)
    run = subprocess.run([sys.executable, str(HERE / "stock_op_outputs.py"), str(tmp_path / "inputs.npz"),
                          str(tmp_path / "outputs.npz")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with np.load(tmp_path / "outputs.npz") as held:
        clean = dict(held)
    ours = stock_op_outputs.outputs({name: stock for name, (stock, _, _) in stock_mlx.OPS.items()}, inputs)
    assert sorted(clean) == sorted(ours) == sorted(stock_op_outputs.NAMES)
    differ = [name for name in clean if not np.array_equal(clean[name], ours[name])]
    assert not differ, f"not MLX's own bits: {differ}"


# Each kernel comparison and the checks above, in a pytest session whose first test installs
# the kernels in-process (as loading a model does): they must still pass against MLX's own.
AFTER_INSTALL = [
    "tests/worker/kernels_installed_first.py",
    "tests/worker/test_stock_mlx.py::test_each_reference_is_mlxs_own_function",
    "tests/worker/test_stock_mlx.py::test_each_reference_gives_the_bits_of_a_process_without_mlxd",
    "tests/worker/test_cpu_kernels.py::test_logsumexp_matches_mlx",
    "tests/worker/test_cpu_kernels.py::test_logsumexp_edge_rows",
    "tests/worker/test_cpu_kernels.py::test_attention_reads_cache_views_and_transposed_queries",
    "tests/worker/test_norm_rope_kernels.py::test_rms_norm_matches_mlx",
    "tests/worker/test_norm_rope_kernels.py::test_rope_matches_mlx",
    "tests/worker/test_quantized_kernels.py::test_mlx_refuses_panels_rather_than_misread_them",
]
# 1 install + 2 checks + 10 logsumexp + 1 + 1 attention + 8 rms_norm + 12 rope + 1
NUM_AFTER_INSTALL = 36


def test_the_kernel_tests_compare_with_mlx_after_a_model_loads_in_process() -> None:
    pytest.importorskip("worker._cpu_kernels", reason="kernels not built: run `make kernels`")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *AFTER_INSTALL],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-4000:]
    assert re.match(rf"{NUM_AFTER_INSTALL} passed\b", summary), summary
