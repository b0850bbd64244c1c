"""Bind MLX's CPU matmuls to the fastest BLAS installed, before MLX is imported.

The mlx-cpu wheel ships the reference BLAS, an order of magnitude slower than an
optimised one. MLX resolves `cblas_*` symbols at load time, so a library loaded earlier
with RTLD_GLOBAL wins. BLIS first: Debian's OpenBLAS 0.3.21 re-packs weights on every
1-row GEMM, which makes decode several times slower; both are fine for prefill. This module must not import mlx.
"""

from __future__ import annotations

import ctypes
import os
import sys

# (name, path) in order of preference; the first that loads wins.
_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("blis-pthread", "/usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3"),
    ("blis-pthread", "/usr/lib/aarch64-linux-gnu/blis-pthread/libblas.so.3"),
    ("blis-openmp", "/usr/lib/x86_64-linux-gnu/blis-openmp/libblas.so.3"),
    ("openblas-pthread", "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"),
    ("openblas-pthread", "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3"),
)

_bound: str | None = None

# Keep the library handle alive for the life of the process.
_handles: list[ctypes.CDLL] = []


def bind_fast_blas() -> str:
    """Load the best BLAS with RTLD_GLOBAL; return what MLX will run on.

    On macOS MLX uses Accelerate/Metal and nothing is done. `MLXD_BLAS=PATH` forces a
    library, `MLXD_BLAS=none` keeps the bundled one (for comparisons).
    """
    global _bound
    if _bound is not None:
        return _bound
    if sys.platform == "darwin":
        _bound = "accelerate"
        return _bound
    if "mlx.core" in sys.modules:
        _bound = "reference (mlx imported before binding)"
        return _bound
    forced = os.environ.get("MLXD_BLAS")
    if forced == "none":
        _bound = "reference"
        return _bound
    candidates = ((forced, forced),) if forced else _CANDIDATES
    threads = str(usable_cores())
    for name, path in candidates:
        if not os.path.exists(path):
            continue
        # BLIS and OpenBLAS read their thread count when loaded; BLIS defaults to one
        # thread, which halves prefill GEMM throughput on a 2-core machine.
        os.environ.setdefault("BLIS_NUM_THREADS", threads)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", threads)
        try:
            _handles.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        except OSError:
            continue
        _bound = f"{name} ({os.environ.get('BLIS_NUM_THREADS' if 'blis' in name else 'OPENBLAS_NUM_THREADS')} threads)"
        return _bound
    _bound = "reference"
    return _bound


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware where the OS tells)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


def missing_blas_hint() -> str:
    """The one command that makes CPU inference fast, for the log when none is bound."""
    return "apt-get install libblis4-pthread  (CPU matmuls run ~10x slower without it)"
