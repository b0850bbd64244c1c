"""The ops mlxd's kernels replace, run on fixed inputs. Run as a script (`python
tests/worker/stock_op_outputs.py inputs.npz outputs.npz`), nothing of mlxd is on the path,
so the outputs are MLX's own bits; tests/worker/test_stock_mlx.py compares the ops of
tests/stock_mlx with them, in its own process, whatever that process has installed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

NAMES = ("logsumexp", "quantized_matmul", "rms_norm", "rope", "scaled_dot_product_attention",
         "quantized_embedding_call")


def make_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """float32 inputs of the sizes a model serves (long rows, several heads, a far position)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    w, scales, biases = mx.quantize(mx.array(normal(48, 256)), group_size=32, bits=4)
    table, table_scales, table_biases = mx.quantize(mx.array(normal(100, 256)), group_size=32, bits=8)
    return {
        "logits": normal(8, 49152) * 8, "hidden": normal(5, 576) * 3, "norm_weight": normal(576),
        "heads": normal(1, 4, 7, 64), "keys": normal(1, 2, 30, 64), "values": normal(1, 2, 30, 64),
        "x": normal(3, 256), "w": np.array(w), "scales": np.array(scales), "biases": np.array(biases),
        "table": np.array(table), "table_scales": np.array(table_scales), "table_biases": np.array(table_biases),
        "ids": np.array([[3, 99, 0]], dtype=np.int32),
    }


def outputs(ops: dict[str, Callable[..., Any]], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each op of `ops` (by the names above) on `inputs`."""
    a = {name: mx.array(value) for name, value in inputs.items()}
    embedding = nn.QuantizedEmbedding(100, 256, group_size=32, bits=8)
    embedding.weight, embedding.scales, embedding.biases = a["table"], a["table_scales"], a["table_biases"]
    out = {
        "logsumexp": ops["logsumexp"](a["logits"], axis=-1, keepdims=True),
        "quantized_matmul": ops["quantized_matmul"](a["x"], a["w"], scales=a["scales"], biases=a["biases"],
                                                    transpose=True, group_size=32, bits=4),
        "rms_norm": ops["rms_norm"](a["hidden"], a["norm_weight"], 1e-5),
        "rope": ops["rope"](a["heads"], 64, traditional=False, base=10000.0, scale=1.0, offset=300),
        "scaled_dot_product_attention": ops["scaled_dot_product_attention"](
            a["heads"], a["keys"], a["values"], scale=0.125, mask=None),
        "quantized_embedding_call": ops["quantized_embedding_call"](embedding, a["ids"]),
    }
    mx.eval(*out.values())
    return {name: np.array(value) for name, value in out.items()}


def _live_ops() -> dict[str, Callable[..., Any]]:
    return {"logsumexp": mx.logsumexp, "quantized_matmul": mx.quantized_matmul, "rms_norm": mx.fast.rms_norm,
            "rope": mx.fast.rope, "scaled_dot_product_attention": mx.fast.scaled_dot_product_attention,
            "quantized_embedding_call": nn.QuantizedEmbedding.__call__}


if __name__ == "__main__":
    loaded = sorted(name for name in sys.modules if name == "worker" or name.startswith(("worker.", "tests")))
    assert not loaded, f"mlxd's modules in the reference process: {loaded}"
    with np.load(sys.argv[1]) as held:
        given = dict(held)
    np.savez(sys.argv[2], **outputs(_live_ops(), given))
