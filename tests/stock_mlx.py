"""MLX's own ops, as MLX ships them: the references mlxd's CPU kernel tests compare with.

Loading a model in a test process (worker.model_loader, worker.text_encoder) installs
mlxd's kernels over `mx.logsumexp`, `mx.quantized_matmul`, `mx.fast.rms_norm`,
`mx.fast.rope` and `nn.QuantizedEmbedding.__call__` for the rest of the session; a kernel
test that looked the op up on `mx` then would compare the kernel with itself. This module
is imported by tests/conftest.py before any test module, so it captures the ops before
anything can install; should it be imported later, a replacement names the op it
replaced (`__wrapped__`, set by worker.cpu_kernels.install) and that op is taken instead.
tests/worker/test_stock_mlx.py checks that each is MLX's own and gives MLX's own bits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def _stock(op: Callable[..., Any]) -> Callable[..., Any]:
    """`op`, or the MLX op under it when it is one of mlxd's replacements."""
    return inspect.unwrap(op)


logsumexp = _stock(mx.logsumexp)
quantized_matmul = _stock(mx.quantized_matmul)
rms_norm = _stock(mx.fast.rms_norm)
rope = _stock(mx.fast.rope)
scaled_dot_product_attention = _stock(mx.fast.scaled_dot_product_attention)
quantized_embedding_call = _stock(nn.QuantizedEmbedding.__call__)

# name -> (the stock op, where the live one is looked up: the object and attribute)
OPS: dict[str, tuple[Callable[..., Any], Any, str]] = {
    "logsumexp": (logsumexp, mx, "logsumexp"),
    "quantized_matmul": (quantized_matmul, mx, "quantized_matmul"),
    "rms_norm": (rms_norm, mx.fast, "rms_norm"),
    "rope": (rope, mx.fast, "rope"),
    "scaled_dot_product_attention": (scaled_dot_product_attention, mx.fast, "scaled_dot_product_attention"),
    "quantized_embedding_call": (quantized_embedding_call, nn.QuantizedEmbedding, "__call__"),
}
