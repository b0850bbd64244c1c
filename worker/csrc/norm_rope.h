// RMSNorm and rotary position embeddings for the CPU stream. MLX's CPU build composes
// both from generic ops (~100 and ~250 us per call at decode sizes here, 60 calls each
// per SmolLM2 step); one pass each costs a few microseconds.
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxd {

// x * rsqrt(mean(x^2, last axis) + eps) * weight: x float32, weight float32 (D,) or none.
// Each row summed in one fixed order: a row's bits never depend on the batch.
mlx::core::array rms_norm(const mlx::core::array& x, const std::optional<mlx::core::array>& weight, float eps,
                          mlx::core::StreamOrDevice s = {});

// mx.fast.rope for float32 x (B, ..., T, D) with base frequencies: the first `dims` of D
// rotate by position * scale * base^(-2i/dims), pairs (i, i + dims/2) or, traditional,
// (2i, 2i + 1). `offsets` holds one start position, or one per sequence (B,).
mlx::core::array rope(const mlx::core::array& x, int dims, bool traditional, float base, float scale,
                      const mlx::core::array& offsets, mlx::core::StreamOrDevice s = {});

}  // namespace mlxd
