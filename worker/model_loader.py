"""Load an mlx-lm model directory for serving, in the dtype this device runs fastest.

On a CPU-only MLX build, quantized and half-precision matmuls run on scalar,
single-threaded kernels (far slower than fp32 through BLAS), so the weights are
dequantized to float32 once at load.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import load as mlx_lm_load

from worker.cpu_kernels import install as install_cpu_kernels

log = logging.getLogger(__name__)

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any
    config: dict[str, Any]
    dtype: str
    device: str
    context_length: int
    weights_bytes: int
    load_time_s: float
    fingerprint: bytes
    attention: str = "mlx"  # what runs attention and SwiGLU (worker.cpu_kernels)


def _float_weight(module: nn.Module, dtype: mx.Dtype) -> mx.array:
    # Scales and biases go up to the target dtype first: dequantizing with fp16 scales
    # would round every weight to fp16 before the cast.
    biases = module.get("biases")
    return mx.dequantize(
        module.weight,
        module.scales.astype(dtype),
        biases.astype(dtype) if biases is not None else None,
        module.group_size, module.bits, module.mode,
    ).astype(dtype)


def _dequantized(module: nn.Module, dtype: mx.Dtype) -> nn.Module | None:
    """A float replacement for a quantized layer, or None if it is not quantized."""
    if isinstance(module, nn.QuantizedLinear):
        weight = _float_weight(module, dtype)
        out_dims, in_dims = weight.shape
        linear = nn.Linear(in_dims, out_dims, bias="bias" in module)
        linear.weight = weight
        if "bias" in module:
            linear.bias = module.bias.astype(dtype)
        return linear
    if isinstance(module, nn.QuantizedEmbedding):
        weight = _float_weight(module, dtype)
        embedding = nn.Embedding(*weight.shape)
        embedding.weight = weight
        return embedding
    return None


def dequantize_model(model: nn.Module, dtype: mx.Dtype) -> int:
    """Replace every quantized layer by its float equivalent; returns how many."""
    replacements = []
    for name, module in model.named_modules():
        new = _dequantized(module, dtype)
        if new is not None:
            replacements.append((name, new))
    if replacements:
        model.update_modules(tree_unflatten(replacements))
    return len(replacements)


def model_fingerprint(path: Path, dtype: str, kernels: str = "mlx") -> bytes:
    """Hash of config, weights, serving dtype and attention kernels: blocks of one model
    (or of one model served in another dtype, or through other kernels, whose KV differs
    in the last bits) are never read by another."""
    h = hashlib.blake2b(digest_size=16)
    h.update(dtype.encode())
    h.update(kernels.split(" ")[0].encode())
    for file in sorted(path.iterdir()):
        if file.suffix in (".json", ".safetensors") and file.is_file():
            h.update(file.name.encode())
            with file.open("rb") as f:
                while chunk := f.read(8 << 20):
                    h.update(chunk)
    return h.digest()


def choose_dtype(requested: str) -> str:
    """'auto' means float32 on a CPU-only backend, the checkpoint's own dtype on GPU."""
    if requested != "auto":
        if requested not in _DTYPES and requested != "native":
            raise ValueError(f"dtype: expected auto, native, float32, float16 or bfloat16, got {requested!r}")
        return requested
    return "float32" if mx.default_device().type == mx.DeviceType.cpu else "native"


def load_for_serving(path: str | Path, dtype: str = "auto") -> LoadedModel:
    """Load weights + tokenizer, convert to the serving dtype, and materialize them."""
    start = time.perf_counter()
    model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    attention = install_cpu_kernels()  # after the load, so the model's module is imported
    effective = choose_dtype(dtype)
    if effective in _DTYPES:
        target = _DTYPES[effective]
        num = dequantize_model(model, target)
        model.set_dtype(target)
        if num:
            log.info("dequantized %d layers to %s for this device", num, effective)
    mx.eval(model.parameters())
    weights_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    context = int(
        config.get("max_position_embeddings")
        or config.get("max_seq_len")
        or config.get("n_positions")
        or 4096
    )
    if effective == "native":
        params = tree_flatten(model.parameters())
        effective = str(params[0][1].dtype).removeprefix("mlx.core.") if params else "unknown"
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        dtype=effective,
        device=str(mx.default_device().type).removeprefix("DeviceType."),
        context_length=context,
        weights_bytes=weights_bytes,
        load_time_s=time.perf_counter() - start,
        fingerprint=model_fingerprint(Path(path), effective, attention),
        attention=attention,
    )
