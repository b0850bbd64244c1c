"""The kernels give the same bits on one thread as on many: each output element is summed
in an order fixed by its own row, never by how the work was split among threads (a
greedy answer must not depend on the machine's core count, or on a busy core)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")
if mx.default_device().type != mx.DeviceType.cpu or sys.platform == "darwin":
    pytest.skip("the kernels serve MLX's CPU build", allow_module_level=True)
pytest.importorskip("worker._cpu_kernels", reason="kernels not built: run `make kernels`")

REPO = Path(__file__).resolve().parents[2]


def digests(threads: int) -> dict[str, str]:
    env = {**os.environ, "MLXD_KERNEL_THREADS": str(threads)}
    result = subprocess.run([sys.executable, "-m", "tests.worker.kernel_outputs"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines.pop("threads") == str(threads)  # the setting reached the kernels
    return lines


def test_one_thread_and_many_give_the_same_bits() -> None:
    one, many = digests(1), digests(4)
    assert len(one) >= 20
    differ = sorted(name for name in one if one[name] != many.get(name))
    assert not differ, f"these kernels' outputs depend on the thread count: {differ}"
