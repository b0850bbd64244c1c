// log(sum(exp(x))) over the last axis, for the CPU stream: the normalisation of every
// decode step's logits (rows x vocabulary), which MLX computes with a scalar exp.
#pragma once

#include "mlx/mlx.h"

namespace mlxd {

// x: float32, at least one dimension. Returns x's shape without its last axis (with a
// last axis of 1 if keepdims). Each row's result depends on that row alone, summed in
// a fixed order, so a row gives the same bits in any batch.
mlx::core::array logsumexp_last(
    const mlx::core::array& x, bool keepdims, mlx::core::StreamOrDevice s = {});

}  // namespace mlxd
