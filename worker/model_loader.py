"""Load an mlx-lm model directory for serving, in the dtype this device runs fastest.

On a CPU-only MLX build, MLX's own quantized and half-precision matmuls run on scalar,
single-threaded kernels. Layers whose quantization mlxd's CPU kernels serve (4/5/8-bit
affine, groups of 32/64/128) stay quantized: decode is memory-bound, so reading the
file's 4.5-bit weights beats fp32 by the ratio of their bytes. Every other weight is
dequantized to float32 once at load, and `dtype = "float32"` dequantizes everything.
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
from mlx_lm.utils import load_model, load_tokenizer

from protocol.context_window import declared_context_length
from worker.cpu_kernels import install as install_cpu_kernels
from worker.cpu_kernels import pack_quantized_panels, serves_quantized
from worker.fused_projections import fuse_sibling_projections
from worker.image_tokens import ImageTable
from worker.image_tokens import install as install_image_embedding
from worker.vision_model import ImageEncoder, is_vision_dir, text_classes

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
    quantization: str = "none"  # what stayed quantized: "4-bit g32: 210 layers, 8-bit g32: 1 layer"
    images: Any = None  # a vision model's ImageEncoder (worker/vision_model.py), else None


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


def _is_quantized(module: nn.Module) -> bool:
    return isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))


def dequantize_model(model: nn.Module, dtype: mx.Dtype, keep_quantized: bool = False) -> int:
    """Replace quantized layers by their float equivalents; returns how many. With
    `keep_quantized`, layers the CPU kernels serve stay as they are."""
    replacements = []
    for name, module in model.named_modules():
        if keep_quantized and _is_quantized(module) and serves_quantized(
                module.bits, module.group_size, getattr(module, "mode", "affine")):
            continue
        new = _dequantized(module, dtype)
        if new is not None:
            replacements.append((name, new))
    if replacements:
        model.update_modules(tree_unflatten(replacements))
    return len(replacements)


def cast_floats(model: nn.Module, dtype: mx.Dtype) -> None:
    """Every float parameter to `dtype`, except the scales and biases of quantized layers:
    float16 ones stay float16 (the kernels read them; float32 would add a bit per weight
    to every decode step's reads), bfloat16 ones become float32 (exact)."""
    quantized = {name for name, module in model.named_modules() if _is_quantized(module)}
    updates = []
    for name, value in tree_flatten(model.parameters()):
        if not mx.issubdtype(value.dtype, mx.floating):
            continue
        module, _, leaf = name.rpartition(".")
        if module in quantized and leaf in ("scales", "biases"):
            if value.dtype in (mx.float16, mx.float32):
                continue
            updates.append((name, value.astype(mx.float32)))
        elif value.dtype != dtype:
            updates.append((name, value.astype(dtype)))
    if updates:
        model.update(tree_unflatten(updates))


def describe_quantization(model: nn.Module) -> str:
    """What stayed quantized, for the load log and /admin/status."""
    layouts: dict[str, int] = {}
    for _, module in model.named_modules():
        if _is_quantized(module):
            layout = f"{module.bits}-bit g{module.group_size}"
            layouts[layout] = layouts.get(layout, 0) + 1
    if not layouts:
        return "none"
    ordered = sorted(layouts.items(), key=lambda item: -item[1])
    return ", ".join(f"{layout}: {count} layer{'s' if count != 1 else ''}" for layout, count in ordered)


def model_fingerprint(path: Path, dtype: str, kernels: str = "mlx", quantization: str = "none") -> bytes:
    """Hash of config, weights, serving dtype, what stayed quantized and the kernels:
    blocks of one model (or of one model served in another dtype, dequantized or not,
    or through other kernels, whose KV differs in the last bits) are never read by
    another."""
    h = hashlib.blake2b(digest_size=16)
    h.update(dtype.encode())
    h.update(kernels.split(" ")[0].encode())
    if quantization != "none":  # the fingerprints of fully dequantized models stay as they were
        h.update(quantization.encode())
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


def load_for_serving(path: str | Path, dtype: str = "auto", fuse_projections: bool = True) -> LoadedModel:
    """Load weights + tokenizer, convert to the serving dtype, and materialize them.

    dtype "auto" on a CPU keeps the layers mlxd's quantized kernels serve (when they
    passed their self-test) and computes in float32; "float32" dequantizes everything.
    The kernels' weights go into panels and sibling projections are fused (the same
    bits; `fuse_projections=False` keeps them apart, for tests that compare the two).
    """
    start = time.perf_counter()
    vision = is_vision_dir(path)
    if vision:  # its language model, as the mlx-lm class its text config names
        model, config = load_model(Path(path), get_model_classes=text_classes)
        tokenizer = load_tokenizer(Path(path), eos_token_ids=config.get("eos_token_id"))
    else:
        model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    attention = install_cpu_kernels()  # after the load, so the model's module is imported
    effective = choose_dtype(dtype)
    if effective in _DTYPES:
        target = _DTYPES[effective]
        keep = dtype == "auto" and target == mx.float32 and attention.startswith("mlxd-cpu")
        num = dequantize_model(model, target, keep_quantized=keep)
        cast_floats(model, target)
        if num:
            log.info("dequantized %d layers to %s for this device", num, effective)
    quantization = describe_quantization(model)
    if quantization != "none":
        packed = pack_quantized_panels(model)
        fused = fuse_sibling_projections(model) if packed and fuse_projections else 0
        log.info("quantized layers served as they are: %s (%d weights in panels for the kernels; %d q/k/v and "
                 "gate/up groups fused)", quantization, packed, fused)
    mx.eval(model.parameters())
    images = None
    if vision:  # after every conversion: the image embedding wraps the final token embedding
        table = ImageTable(config["text_config"]["vocab_size"])
        install_image_embedding(model, table)
        images = ImageEncoder(path, model, table)
        log.info("vision model: images go through %s's tower and processor", config.get("model_type"))
    weights_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    context = declared_context_length(config)
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
        fingerprint=model_fingerprint(Path(path), effective, attention, quantization),
        attention=attention,
        quantization=quantization,
        images=images,
    )
