"""Which quantized layouts a CPU worker serves as they are (mlxd's quantized kernels) and
which it dequantizes to float32: the worker loads by it, the router's memory estimate
charges by it, so the two never disagree about what a model costs."""

from __future__ import annotations

SERVED_BITS = (4, 5, 8)
SERVED_GROUP_SIZES = (32, 64, 128)


def served_quantized(bits: int, group_size: int, mode: str = "affine") -> bool:
    """Whether a quantized layer of this layout stays quantized on a CPU worker."""
    return mode == "affine" and bits in SERVED_BITS and group_size in SERVED_GROUP_SIZES
