"""Route a model's attention and SwiGLU, and the sampler's logsumexp, through mlxd's
CPU kernels (worker/csrc).

MLX's CPU build computes `exp` one float at a time on one thread, so attention and the
gated MLP dominate prefill on Linux; the kernels vectorize exp and spread rows over
every core (figures: the commit messages and bench/ output). Each output row still depends only
on its own query, keys and mask, so batching and prefix-cache hits give the tokens a
request would get alone, and cached and uncached prefill run the same code.

mlx-lm's models call `scaled_dot_product_attention` and `swiglu` through their module
globals; installing swaps those names in every loaded `mlx_lm.models.*` module, and
anything the kernels do not cover (half precision, quantized caches, attention sinks,
odd head sizes, the GPU) goes to mlx-lm's own function unchanged. `mx.logsumexp` is
replaced process-wide (BatchGenerator calls it on mlx.core) for last-axis float32 input.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx

log = logging.getLogger(__name__)

_installed: str | None = None
_stock_logsumexp = mx.logsumexp  # captured before install() replaces it


def _load_extension() -> Any | None:
    try:
        from worker import _cpu_kernels
    except ImportError as exc:
        log.warning("CPU kernels not built (%s): attention runs on MLX's slower path; run `make kernels`", exc)
        return None
    return _cpu_kernels


def _self_test(kernels: Any) -> str | None:
    """None if the extension agrees with MLX on a small case, else why not (for example
    a nanobind ABI that differs from the installed MLX's: arrays are then rejected)."""
    try:
        q = mx.random.normal((1, 4, 3, 16), key=mx.random.key(0))
        k = mx.random.normal((1, 2, 5, 16), key=mx.random.key(1))
        v = mx.random.normal((1, 2, 5, 16), key=mx.random.key(2))
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
        got = kernels.attention(q, k, v, scale=0.25, causal=True)
        gate, up = q.reshape(-1)[:128], k.reshape(-1)[:128]
        want_act = gate * mx.sigmoid(gate) * up
        rows = q.reshape(4, -1)
        want_lse = _stock_logsumexp(rows, axis=-1, keepdims=True)
        err = max(mx.abs(want - got).max().item(), mx.abs(want_act - kernels.swiglu(gate, up)).max().item(),
                  mx.abs(want_lse - kernels.logsumexp_last(rows, keepdims=True)).max().item())
    except (TypeError, ValueError, RuntimeError) as exc:
        return str(exc).splitlines()[0]
    return None if err < 1e-4 else f"results differ from MLX by {err:g}"


def _attention(kernels: Any, fallback: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: mx.array | None = None,
    ) -> mx.array:
        if (
            sinks is None
            and not hasattr(cache, "bits")
            and queries.ndim == 4
            and queries.dtype == mx.float32
            and keys.dtype == mx.float32
            and values.dtype == mx.float32
            and keys.shape == values.shape
            and queries.shape[-1] == keys.shape[-1]
            and queries.shape[-1] % 8 == 0
            and queries.shape[-1] <= 256
        ):
            if mask is None:
                return kernels.attention(queries, keys, values, scale=scale)
            if isinstance(mask, str) and mask == "causal":
                return kernels.attention(queries, keys, values, scale=scale, causal=True)
            if isinstance(mask, mx.array):
                return kernels.attention(queries, keys, values, scale=scale, mask=mask)
        return fallback(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    return scaled_dot_product_attention


def _swiglu(kernels: Any, fallback: Callable[[mx.array, mx.array], mx.array]) -> Callable[[mx.array, mx.array], mx.array]:
    def swiglu(gate: mx.array, x: mx.array) -> mx.array:
        if gate.dtype == mx.float32 and x.dtype == mx.float32 and gate.shape == x.shape:
            return kernels.swiglu(gate, x)
        return fallback(gate, x)

    return swiglu


def _logsumexp(kernels: Any, fallback: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def logsumexp(a: Any, /, axis: Any = None, keepdims: bool = False, *, stream: Any = None) -> mx.array:
        if (
            stream is None
            and isinstance(a, mx.array)
            and a.dtype == mx.float32
            and a.ndim >= 1
            and a.size > 0
            and axis in (-1, a.ndim - 1)
        ):
            return kernels.logsumexp_last(a, keepdims=keepdims)
        return fallback(a, axis=axis, keepdims=keepdims, stream=stream)

    return logsumexp


def install() -> str:
    """Swap the kernels into every loaded mlx-lm model module; return what now runs
    attention, for the load log, /health and the prefix-cache fingerprint (its first
    word). Idempotent; a no-op off the CPU."""
    global _installed
    if _installed is not None:
        return _installed
    if mx.default_device().type != mx.DeviceType.cpu:
        _installed = "mlx"
        return _installed
    kernels = _load_extension()
    if kernels is None:
        _installed = "mlx (kernels not built)"
        return _installed
    problem = _self_test(kernels)
    if problem is not None:
        log.warning("CPU kernels disabled: %s; rebuild them with `make kernels`", problem)
        _installed = "mlx (kernels failed self-test)"
        return _installed
    from mlx_lm.models import activations, base

    stock_attention, stock_swiglu = base.scaled_dot_product_attention, activations.swiglu
    replacements = {
        "scaled_dot_product_attention": (stock_attention, _attention(kernels, stock_attention)),
        "swiglu": (stock_swiglu, _swiglu(kernels, stock_swiglu)),
    }
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is None:
            continue
        for attr, (stock, ours) in replacements.items():
            if getattr(module, attr, None) is stock:
                setattr(module, attr, ours)
    # BatchGenerator normalises every step's logits (rows x vocabulary) with
    # mx.logsumexp, looked up on mlx.core at each call: on MLX's scalar exp that is a
    # visible share of a decode step. Only last-axis float32 calls change.
    mx.logsumexp = _logsumexp(kernels, _stock_logsumexp)
    # the version names the numerics: prefix-cache fingerprints include it
    _installed = f"mlxd-cpu-1 ({kernels.threads()} threads)"
    return _installed
