// Scaled dot-product attention for MLX's CPU stream, in float32.
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxd {

// q: (B, Hq, L, D); k, v: (B, Hkv, S, D) with Hq a multiple of Hkv (grouped-query).
// mask: none, causal (query i sees keys j <= S - L + i) or an array broadcastable to
// (B, Hq, L, S): bool keeps where true, float is added to the scores.
// Returns (B, Hq, L, D). Each output row depends only on its own query, keys and mask,
// never on what else is in the batch.
mlx::core::array attention(
    const mlx::core::array& q,
    const mlx::core::array& k,
    const mlx::core::array& v,
    float scale,
    bool causal,
    const std::optional<mlx::core::array>& mask,
    mlx::core::StreamOrDevice s = {});

}  // namespace mlxd
