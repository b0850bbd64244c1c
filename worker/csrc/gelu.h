// GELU in its exact (erf) form, as BERT-family encoders use it, for the CPU stream.
#pragma once

#include "mlx/mlx.h"

namespace mlxd {

// 0.5 x (1 + erf(x / sqrt(2))) of a float32 array; erf within ~2e-7 of the true value
// (Abramowitz-Stegun 7.1.26 on the vectorized exp). MLX's CPU build computes erf one
// float at a time on one thread: ~40 ns an element, most of a MiniLM forward pass.
// Every element goes through the same vector code (a tail is padded), so its result
// never depends on where it lies in the array.
mlx::core::array gelu(const mlx::core::array& x, mlx::core::StreamOrDevice s = {});

}  // namespace mlxd
