"""Route a model's attention, SwiGLU and quantized matmuls/embeddings, and the sampler's
logsumexp, through mlxd's CPU kernels (worker/csrc).

MLX's CPU build computes `exp` one float at a time on one thread, so attention and the
gated MLP dominate prefill on Linux; the kernels vectorize exp and spread rows over
every core (figures: the commit messages and bench/ output). Each output row still depends only
on its own query, keys and mask, so batching and prefix-cache hits give the tokens a
request would get alone, and cached and uncached prefill run the same code.

mlx-lm's models call `scaled_dot_product_attention` and `swiglu` through their module
globals; installing swaps those names in every loaded `mlx_lm.models.*` module, and
anything the kernels do not cover (half precision, quantized caches, attention sinks,
odd head sizes, the GPU) goes to mlx-lm's own function unchanged. `mx.logsumexp` is
replaced process-wide (BatchGenerator calls it on mlx.core) for last-axis float32 input,
and so is `mx.quantized_matmul` (nn.QuantizedLinear and a tied QuantizedEmbedding's
`as_linear` call it there) for float32 input against 4/5/8-bit affine weights in groups of
32/64/128; `nn.QuantizedEmbedding` looks its rows up through the kernels' gather.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from protocol.served_quantization import served_quantized

log = logging.getLogger(__name__)

_installed: str | None = None
_stock_logsumexp = mx.logsumexp  # captured before install() replaces it
_stock_quantized_matmul = mx.quantized_matmul
_stock_rms_norm = mx.fast.rms_norm
_stock_rope = mx.fast.rope
QUANTIZED_SCALE_DTYPES = (mx.float32, mx.float16)


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
                  mx.abs(want_lse - kernels.logsumexp_last(rows, keepdims=True)).max().item(),
                  mx.abs(nn.gelu(rows * 4) - kernels.gelu(rows * 4)).max().item(),
                  mx.abs(_stock_rms_norm(rows, None, 1e-5) - kernels.rms_norm(rows, None, 1e-5)).max().item(),
                  mx.abs(_stock_rope(q, 16, traditional=False, base=1e4, scale=1.0, offset=3)
                         - kernels.rope(q, 16, traditional=False, base=1e4, scale=1.0,
                                        offsets=mx.array([3], dtype=mx.int32))).max().item())
        quantized = _quantized_problem(kernels)
    except (TypeError, ValueError, RuntimeError) as exc:
        return str(exc).splitlines()[0]
    if err >= 1e-4:
        return f"results differ from MLX by {err:g}"
    return quantized


def _quantized_problem(kernels: Any) -> str | None:
    """None if the quantized matmul (every width, both scale dtypes, decode and prefill
    shapes) agrees with MLX's dequantized product, a row alone gives the bits it gives
    in a batch and a token the bits it gives inside a longer segment; else what differs."""
    weight = mx.random.normal((48, 128), key=mx.random.key(3))
    for bits, dtype in ((4, mx.float16), (5, mx.float16), (8, mx.float32)):
        w, scales, biases = mx.quantize(weight, group_size=32, bits=bits)
        scales, biases = scales.astype(dtype), biases.astype(dtype)
        reference = mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), group_size=32, bits=bits)
        for tokens in (1, 3, 13):
            x = mx.random.normal((2, tokens, 128), key=mx.random.key(tokens))
            got = kernels.quantized_matmul(x, w, scales, biases, group_size=32, bits=bits)
            alone = kernels.quantized_matmul(x[1:], w, scales, biases, group_size=32, bits=bits)
            last = kernels.quantized_matmul(x[1:, -1:], w, scales, biases, group_size=32, bits=bits)
            if not (mx.array_equal(alone, got[1:]).item() and mx.array_equal(last, got[1:, -1:]).item()):
                return f"a {bits}-bit row differs alone and in a batch"
            want = x @ reference.T
            error = mx.abs(want - got).max().item() / mx.abs(want).max().item()
            if error > 1e-3:
                return f"{bits}-bit matmul of {tokens} tokens differs from MLX by {error:.2g} (relative)"
        ids = mx.array([[5, 0], [47, 5]])
        rows = kernels.quantized_gather(w, scales, biases, ids, group_size=32, bits=bits)
        if mx.abs(rows - reference[ids]).max().item() > 1e-5:
            return f"{bits}-bit gather differs from MLX"
        for panel_rows in (16, 8):
            panels = kernels.quantized_panels(w, scales, biases, group_size=32, bits=bits, panel_rows=panel_rows)
            if not (mx.array_equal(kernels.quantized_matmul(x, *panels, group_size=32, bits=bits), got).item()
                    and mx.array_equal(kernels.quantized_gather(*panels, ids, group_size=32, bits=bits), rows).item()):
                return f"{bits}-bit weights in panels of {panel_rows} give other results than MLX's layout"
    return None


def pack_quantized_panels(model: nn.Module) -> int:
    """Put every quantized weight the kernels serve into panels of the height this CPU's
    loop reads (16 rows for AVX-512, 8 for AVX2; worker/csrc/quantized_layout.h): each
    32-value block of a panel's rows is stored together, in the order the loop cuts it
    into multiply-add operands, so the weights stream from memory as one sequence and
    unpack in a few instructions. Results are the same bits as from MLX's layout (which
    the scalar loop reads); MLX's own quantized ops refuse the panel shape (a clear
    error, never misread weights), so this runs only once the kernels are installed.
    Returns the number of weights put in panels."""
    if not install().startswith("mlxd-cpu"):
        return 0
    kernels = _load_extension()
    panel_rows = kernels.quantized_panel_rows()
    if panel_rows <= 1:
        return 0
    packed = 0
    for name, module in model.named_modules():
        if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            continue
        scales, biases = module.get("scales"), module.get("biases")
        if (biases is None or not serves_quantized(module.bits, module.group_size, getattr(module, "mode", "affine"))
                or scales.dtype not in QUANTIZED_SCALE_DTYPES or biases.dtype != scales.dtype
                or module.weight.shape[0] != scales.shape[0]):
            continue
        rows = module.weight.shape[0]
        # a height that divides the rows: the AVX2 loop's 8 serves where 16 does not
        height = next((h for h in (panel_rows, 8) if h <= panel_rows and rows % h == 0), None)
        if height is None:
            log.warning("%s: %d rows, not a multiple of 8: left in MLX's layout, which the kernels' scalar loop "
                        "reads (correct, but slow)", name, rows)
            continue
        module.weight, module.scales, module.biases = kernels.quantized_panels(
            module.weight, scales, biases, group_size=module.group_size, bits=module.bits, panel_rows=height)
        mx.eval(module.weight, module.scales, module.biases)
        packed += 1
    return packed


def serves_quantized(bits: int, group_size: int, mode: str = "affine") -> bool:
    """Whether the kernels run a quantized layer of this layout (the loader keeps such
    layers quantized and dequantizes the rest; protocol.served_quantization says which)."""
    return served_quantized(bits, group_size, mode)


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


def _quantized_matmul(kernels: Any, fallback: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def quantized_matmul(
        x: mx.array,
        w: mx.array,
        /,
        scales: mx.array,
        biases: mx.array | None = None,
        transpose: bool = True,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "affine",
        *,
        stream: Any = None,
    ) -> mx.array:
        if (
            stream is None
            and transpose
            and biases is not None
            and group_size is not None
            and bits is not None
            and serves_quantized(bits, group_size, mode)
            and x.dtype == mx.float32
            and w.dtype == mx.uint32
            and w.ndim == 2
            and scales.ndim == 2
            and scales.dtype in QUANTIZED_SCALE_DTYPES
            and biases.dtype == scales.dtype
            and x.ndim >= 1
            and x.shape[-1] == scales.shape[1] * group_size  # w may be packed: see pack_quantized_panels
        ):
            return kernels.quantized_matmul(x, w, scales, biases, group_size=group_size, bits=bits)
        return fallback(x, w, scales=scales, biases=biases, transpose=transpose, group_size=group_size,
                        bits=bits, mode=mode, stream=stream)

    return quantized_matmul


def _quantized_embedding(kernels: Any, fallback: Callable[[Any, mx.array], mx.array]) -> Callable[[Any, mx.array], mx.array]:
    def __call__(self: Any, x: mx.array) -> mx.array:
        biases = self.get("biases")
        if (
            biases is not None
            and serves_quantized(self.bits, self.group_size, getattr(self, "mode", "affine"))
            and self["scales"].dtype in QUANTIZED_SCALE_DTYPES
            and biases.dtype == self["scales"].dtype
        ):
            return kernels.quantized_gather(
                self["weight"], self["scales"], biases, x, group_size=self.group_size, bits=self.bits)
        return fallback(self, x)

    return __call__


def _rms_norm(kernels: Any, fallback: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def rms_norm(x: mx.array, weight: mx.array | None, eps: float, *, stream: Any = None) -> mx.array:
        if (
            stream is None
            and x.dtype == mx.float32
            and x.ndim >= 1
            and (weight is None or (weight.dtype == mx.float32 and weight.shape == (x.shape[-1],)))
        ):
            return kernels.rms_norm(x, weight, eps)
        return fallback(x, weight, eps, stream=stream)

    return rms_norm


def _rope(kernels: Any, fallback: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def rope(a: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float, offset: Any,
             freqs: mx.array | None = None, stream: Any = None) -> mx.array:
        if (
            stream is None
            and freqs is None
            and base is not None
            and a.dtype == mx.float32
            and a.ndim >= 3
            and dims % 2 == 0
            and 0 < dims <= a.shape[-1]
        ):
            offsets = mx.array([offset], dtype=mx.int32) if isinstance(offset, int) else offset
            if isinstance(offsets, mx.array) and (offsets.size == 1 or offsets.shape == (a.shape[0],)):
                return kernels.rope(a, dims, traditional=traditional, base=base, scale=scale,
                                    offsets=offsets.reshape(-1))
        return fallback(a, dims, traditional=traditional, base=base, scale=scale, offset=offset, freqs=freqs,
                        stream=stream)

    return rope


def _replacing(stock: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    """`ours`, naming the MLX op it replaces process-wide (`inspect.unwrap` finds it): a
    test that must compare with MLX's own op, whatever is installed, asks for it there."""
    ours.__wrapped__ = stock  # type: ignore[attr-defined]
    return ours


@functools.cache
def encoder_ops() -> tuple[Callable[[mx.array], mx.array] | None, Callable[..., mx.array] | None]:
    """(gelu, attention) from the kernels for BERT-family encoders, or (None, None) where
    the kernels do not run (another device, not built, failed self-test). MLX's CPU erf
    and masked attention were ~90% of a MiniLM forward pass: at batch 32 x 24 tokens,
    36 ms vs 0.9 ms per GELU and ~40 ms per attention call."""
    if not install().startswith("mlxd-cpu"):
        return None, None
    kernels = _load_extension()

    def gelu(x: mx.array) -> mx.array:
        return kernels.gelu(x) if x.dtype == mx.float32 else nn.gelu(x)

    def stock(q: mx.array, k: mx.array, v: mx.array, cache: Any, scale: float, mask: Any,
              sinks: mx.array | None = None) -> mx.array:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    attend = _attention(kernels, stock)
    return gelu, lambda q, k, v, scale, mask: attend(q, k, v, None, scale=scale, mask=mask)


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
    mx.logsumexp = _replacing(_stock_logsumexp, _logsumexp(kernels, _stock_logsumexp))
    mx.quantized_matmul = _replacing(_stock_quantized_matmul, _quantized_matmul(kernels, _stock_quantized_matmul))
    # nn.RMSNorm and nn.RoPE (and mlx-lm's rope variants) call these on mlx.core.fast: MLX's
    # CPU build composes each from a handful of ops, ~100-250 us per call at decode sizes
    mx.fast.rms_norm = _replacing(_stock_rms_norm, _rms_norm(kernels, _stock_rms_norm))
    mx.fast.rope = _replacing(_stock_rope, _rope(kernels, _stock_rope))
    stock_embedding = nn.QuantizedEmbedding.__call__
    nn.QuantizedEmbedding.__call__ = _replacing(stock_embedding, _quantized_embedding(kernels, stock_embedding))
    # the version names the numerics: prefix-cache fingerprints include it (and the
    # quantized inner loop, whose lanes the scalar fallback reproduces, for the record)
    _installed = f"mlxd-cpu-7 ({kernels.threads()} threads, quantized {kernels.quantized_isa()})"
    return _installed
