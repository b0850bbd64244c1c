"""Runs every mlxd CPU kernel on fixed inputs and prints a digest of each output's bytes,
one `name digest` line each. tests/worker/test_kernel_threads.py runs it in processes with
different MLXD_KERNEL_THREADS (read once per process) and compares the digests."""

from __future__ import annotations

import hashlib

import mlx.core as mx

from worker import _cpu_kernels as kernels


def _normal(*shape: int, seed: int) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed))


def outputs() -> dict[str, mx.array]:
    """Shapes large enough that each kernel splits its work into many items."""
    out: dict[str, mx.array] = {}
    q, k, v = _normal(2, 8, 96, 64, seed=1), _normal(2, 2, 700, 64, seed=2), _normal(2, 2, 700, 64, seed=3)
    out["attention"] = kernels.attention(q, k, v, scale=0.125)
    out["attention_causal"] = kernels.attention(q, k, v, scale=0.125, causal=True)
    out["attention_bool_mask"] = kernels.attention(q, k, v, scale=0.125, mask=_normal(96, 700, seed=4) > 0)
    out["attention_additive_mask"] = kernels.attention(q, k, v, scale=0.125, mask=_normal(96, 700, seed=5))
    decode_q = _normal(8, 8, 1, 64, seed=6)
    out["attention_decode"] = kernels.attention(decode_q, _normal(8, 2, 3000, 64, seed=7),
                                                _normal(8, 2, 3000, 64, seed=8), scale=0.125)
    x = _normal(64, 4096, seed=9)
    out["gelu"] = kernels.gelu(x)
    out["swiglu"] = kernels.swiglu(x, _normal(64, 4096, seed=10))
    out["logsumexp"] = kernels.logsumexp_last(x)
    out["rms_norm"] = kernels.rms_norm(x, _normal(4096, seed=11), 1e-6)
    out["rope"] = kernels.rope(_normal(2, 8, 64, 128, seed=12), 128, traditional=False, base=10000.0, scale=1.0,
                               offsets=mx.array([3, 17], dtype=mx.int32))
    for bits in (4, 5, 8):
        w, scales, biases = mx.quantize(_normal(256, 1024, seed=13 + bits), group_size=32, bits=bits)
        for m in (1, 7, 64):
            out[f"quantized_matmul_{bits}bit_m{m}"] = kernels.quantized_matmul(
                _normal(m, 1024, seed=20 + m), w, scales, biases, group_size=32, bits=bits)
        rows = kernels.quantized_panel_rows()
        if rows > 1:
            panels = kernels.quantized_panels(w, scales, biases, group_size=32, bits=bits, panel_rows=rows)
            out[f"quantized_matmul_{bits}bit_panels"] = kernels.quantized_matmul(
                _normal(64, 1024, seed=30), *panels, group_size=32, bits=bits)
        out[f"quantized_gather_{bits}bit"] = kernels.quantized_gather(
            w, scales, biases, mx.array(list(range(0, 256, 3)), dtype=mx.int32), group_size=32, bits=bits)
    mx.eval(*out.values())
    return out


if __name__ == "__main__":
    print(f"threads {kernels.threads()}")
    for name, array in outputs().items():
        print(name, hashlib.sha256(memoryview(array).tobytes()).hexdigest())
