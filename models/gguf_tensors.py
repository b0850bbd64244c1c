"""Turn one GGUF tensor into the MLX arrays and mlx-lm name an mlx-lm model loads.

Owns the name map, the un-permutation of llama's rope rows and the per-type decoding:
Q4_0/Q4_1/Q8_0 repack bit-exactly into MLX affine quantization (group 32), the other
supported block types dequantize through gguf-py, floats pass through.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.gguf_reader import ReaderTensor
from gguf.quants import dequantize as gguf_dequantize

# Block types MLX holds as affine quantized weights with no loss: bits per value.
NATIVE_QUANT_BITS: dict[GGMLQuantizationType, int] = {
    GGMLQuantizationType.Q4_0: 4,
    GGMLQuantizationType.Q4_1: 4,
    GGMLQuantizationType.Q8_0: 8,
}
FLOAT_TYPES = frozenset(
    {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
)
# Block types MLX has no layout for: dequantized with gguf-py's reference decoders.
DEQUANTIZED_TYPES = frozenset(
    {
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
    }
)
SUPPORTED_TYPES = frozenset(NATIVE_QUANT_BITS) | FLOAT_TYPES | DEQUANTIZED_TYPES

GROUP_SIZE = 32  # every native GGUF block holds 32 values with one scale

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


def _pack_affine(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned `bits`-wide values (..., n) into MLX's little-endian uint32 words."""
    if bits == 4:
        values = values[..., 0::2] | (values[..., 1::2] << 4)
    flat = np.ascontiguousarray(values.astype(np.uint8))
    return flat.reshape(flat.shape[0], -1).view(np.uint32)


def repack_native(
    rows: np.ndarray, tensor_type: GGMLQuantizationType
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0/Q4_1/Q8_0 blocks as MLX affine (weight, scales, biases), bit-exactly.

    Every format is `value = scale * q + bias` per 32 values: Q4_1 stores (d, m) as
    (scale, bias); Q4_0 is d * (q - 8), bias -8d; Q8_0 is d * int8, shifted to uint8
    with bias -128d. Multiplying an fp16 by a power of two is exact, so nothing is lost.
    """
    if sys.byteorder != "little":
        raise ValueError("the GGUF repacker assumes a little-endian host")
    num_rows = rows.shape[0]
    if tensor_type == GGMLQuantizationType.Q8_0:
        blocks = rows.reshape(num_rows, -1, 34)
        scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
        values = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return _pack_affine(values, 8), scale, (scale * -128).astype(np.float16)
    if tensor_type == GGMLQuantizationType.Q4_0:
        blocks = rows.reshape(num_rows, -1, 18)
        scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
        bias = (scale * -8).astype(np.float16)
        packed = blocks[..., 2:]
    elif tensor_type == GGMLQuantizationType.Q4_1:
        blocks = rows.reshape(num_rows, -1, 20)
        scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        packed = blocks[..., 4:]
    else:
        raise ValueError(f"{tensor_type.name} is not an MLX-native block type")
    # A block keeps values 0..15 in the low nibbles and 16..31 in the high ones.
    values = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
    return _pack_affine(values, 4), scale, bias


def _floats(rows: np.ndarray, tensor: ReaderTensor) -> mx.array:
    """Float rows as an MLX array in the file's own precision."""
    if tensor.tensor_type == GGMLQuantizationType.BF16:
        bits = np.ascontiguousarray(rows).view(np.uint16)
        return mx.array(bits).view(mx.bfloat16)
    return mx.array(rows)


@dataclass(frozen=True)
class ConvertedTensor:
    """One GGUF tensor in mlx-lm form: `arrays` keyed by full parameter name.

    `bits` is set when the tensor stays MLX-quantized (it then has .scales/.biases).
    """

    module: str
    arrays: dict[str, mx.array]
    bits: int | None


def convert_tensor(
    tensor: ReaderTensor,
    *,
    dtype: str,
    rope_heads: int | None = None,
) -> ConvertedTensor:
    """Decode one tensor; `rope_heads` un-permutes llama Q/K rows for that many heads.

    dtype "native" keeps Q4_0/Q4_1/Q8_0 quantized, stores the other block types as
    float16 and floats as stored; a float dtype name dequantizes everything to it.
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
        weight, scales, biases = (mx.array(a) for a in repack_native(rows, tensor_type))
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
        values = gguf_dequantize(rows, tensor_type)
        array = mx.array(values).astype(mx.float16 if dtype == "native" else DTYPES[dtype])
    return ConvertedTensor(module, {name: array.reshape(shape)}, None)


def find_tensor(reader: GGUFReader, name: str) -> ReaderTensor | None:
    """The tensor called `name`, or None."""
    for tensor in reader.tensors:
        if tensor.name == name:
            return tensor
    return None
