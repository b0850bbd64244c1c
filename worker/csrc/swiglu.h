// silu(gate) * up, the gated MLP activation of Llama-family models, for the CPU stream.
#pragma once

#include "mlx/mlx.h"

namespace mlxd {

// gate and up: float32 arrays of one shape. Elementwise, so the result for an element
// never depends on the rest of the batch.
mlx::core::array swiglu(
    const mlx::core::array& gate, const mlx::core::array& up, mlx::core::StreamOrDevice s = {});

}  // namespace mlxd
