"""Turn one GGUF tensor into the MLX arrays and mlx-lm name an mlx-lm model loads.

Owns the name map, the un-permutation of llama's rope rows and the per-type decoding:
Q4_0/Q4_1/Q8_0/Q4_K and the 5-bit types repack bit-exactly into MLX affine quantization
(group 32, models/gguf_repack.py), Q6_K/Q3_K/Q2_K are requantized to 8 bits (the error
is logged), floats pass through.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.gguf_reader import ReaderTensor
from gguf.quants import dequantize as gguf_dequantize

from models.gguf_repack import EXACT_BITS, GROUP_SIZE, repack_exact, repack_native, requantize_8bit

__all__ = ["GROUP_SIZE", "repack_native"]  # re-exported for the importer and its tests

logger = logging.getLogger(__name__)

# Block types MLX holds as affine quantized weights with no loss: bits per value.
NATIVE_QUANT_BITS: dict[GGMLQuantizationType, int] = EXACT_BITS
FLOAT_TYPES = frozenset(
    {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
)
# Block types with no exact MLX layout (16-value sub-blocks): decoded with gguf-py's
# reference decoders, then requantized to 8 bits in groups of 32 ("native") or kept as
# floats (a float dtype).
DEQUANTIZED_TYPES = frozenset(
    {
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q6_K,
    }
)
SUPPORTED_TYPES = frozenset(NATIVE_QUANT_BITS) | FLOAT_TYPES | DEQUANTIZED_TYPES

DTYPES: dict[str, mx.Dtype] = {
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def mlx_name(gguf_name: str) -> str:
    """The mlx-lm parameter name for a GGUF tensor name; ValueError for an unknown one.

    Refusing unknown tensors (rather than dropping them) keeps a model with extra parts
    (e.g. MoE experts under a llama arch tag) from loading silently wrong.
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_PATTERN.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no mlx-lm counterpart")


def check_tensor_type(tensor: ReaderTensor) -> None:
    """Raise a ValueError naming the tensor and its type when it cannot be converted."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise ValueError(
            f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the "
            f"converter does not support (supported: {supported})"
        )


def logical_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """Row-major shape (outermost first): GGUF lists dimensions innermost first."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def raw_rows(tensor: ReaderTensor) -> np.ndarray:
    """The tensor's stored data as 2-D rows (one row per output unit, blocks and all)."""
    data = tensor.data
    if data.ndim == 1:
        return data.reshape(1, -1)
    return data.reshape(-1, data.shape[-1])


def unpermute_rope_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's llama-arch Q/K row permutation, giving back the HF row order.

    llama.cpp's converter interleaves each head's two rope halves (row 2i holds HF row i,
    row 2i+1 holds HF row i + head_dim/2) so its "normal" rope can rotate adjacent
    pairs. Rows are whole output units even for block-quantized data (blocks run along
    the input dimension), so the raw rows move as they are.
    """
    half = rows.shape[0] // num_heads // 2
    per_head = rows.reshape(num_heads, half, 2, *rows.shape[1:])
    return np.ascontiguousarray(per_head.swapaxes(1, 2)).reshape(rows.shape)


def _floats(rows: np.ndarray, tensor: ReaderTensor) -> mx.array:
    """Float rows as an MLX array in the file's own precision."""
    if tensor.tensor_type == GGMLQuantizationType.BF16:
        bits = np.ascontiguousarray(rows).view(np.uint16)
        return mx.array(bits).view(mx.bfloat16)
    return mx.array(rows)


@dataclass(frozen=True)
class ConvertedTensor:
    """One GGUF tensor in mlx-lm form: `arrays` keyed by full parameter name.

    `bits` is set when the tensor stays MLX-quantized (it then has .scales/.biases);
    `max_error` is the largest difference from llama.cpp's values when it was
    requantized (0.0 for exact layouts).
    """

    module: str
    arrays: dict[str, mx.array]
    bits: int | None
    max_error: float = 0.0


def convert_tensor(
    tensor: ReaderTensor,
    *,
    dtype: str,
    rope_heads: int | None = None,
) -> ConvertedTensor:
    """Decode one tensor; `rope_heads` un-permutes llama Q/K rows for that many heads.

    dtype "native" keeps every quantized type quantized (exactly, or requantized to 8
    bits where no exact layout exists) and floats as stored; a float dtype name
    dequantizes everything to it.
    """
    check_tensor_type(tensor)
    name = mlx_name(tensor.name)
    module, kind = name.rsplit(".", 1)
    shape = logical_shape(tensor)
    rows = raw_rows(tensor)
    if rope_heads is not None:
        rows = unpermute_rope_rows(rows, rope_heads)

    tensor_type = tensor.tensor_type
    if tensor_type in NATIVE_QUANT_BITS:
        bits = NATIVE_QUANT_BITS[tensor_type]
        weight, scales, biases = (mx.array(a) for a in repack_exact(rows, tensor_type))
        if dtype == "native":
            arrays = {name: weight, f"{module}.scales": scales, f"{module}.biases": biases}
            return ConvertedTensor(module, arrays, bits)
        full = mx.dequantize(
            weight,
            scales.astype(mx.float32),
            biases.astype(mx.float32),
            group_size=GROUP_SIZE,
            bits=bits,
        )
        return ConvertedTensor(module, {name: full.astype(DTYPES[dtype])}, None)

    if tensor_type in FLOAT_TYPES:
        array = _floats(rows, tensor)
        if dtype != "native":
            array = array.astype(DTYPES[dtype])
    else:
        values = gguf_dequantize(rows, tensor_type).reshape(-1, shape[-1])
        if dtype == "native" and values.shape[-1] % GROUP_SIZE == 0:
            (weight, scales, biases), error = requantize_8bit(values)
            arrays = {name: mx.array(weight), f"{module}.scales": mx.array(scales), f"{module}.biases": mx.array(biases)}
            logger.info("%s: %s requantized to 8 bits, max error %.3g", tensor.name, tensor_type.name, error)
            return ConvertedTensor(module, arrays, 8, error)
        array = mx.array(values).astype(mx.float32 if dtype == "native" else DTYPES[dtype])
    return ConvertedTensor(module, {name: array.reshape(shape)}, None)


def find_tensor(reader: GGUFReader, name: str) -> ReaderTensor | None:
    """The tensor called `name`, or None."""
    for tensor in reader.tensors:
        if tensor.name == name:
            return tensor
    return None
