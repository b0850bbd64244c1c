"""Not collected on its own (no test_ prefix): tests/worker/test_stock_mlx.py runs it first
in a pytest session of the kernel tests, to install mlxd's kernels in-process as loading
a model does (worker.model_loader.load_for_serving calls the same install)."""

from __future__ import annotations

import mlx.core as mx

from worker.cpu_kernels import install


def test_install_the_kernels_in_this_process() -> None:
    assert install().startswith("mlxd-cpu"), "the kernels did not install: nothing to check"
    assert mx.logsumexp.__module__ == "worker.cpu_kernels"
    assert mx.fast.rms_norm.__module__ == "worker.cpu_kernels"
    assert mx.fast.rope.__module__ == "worker.cpu_kernels"
    assert mx.quantized_matmul.__module__ == "worker.cpu_kernels"
