// Matmuls and row gathers against MLX affine-quantized weights (4, 5 or 8 bits, groups of
// 32, 64 or 128), for the CPU stream: MLX's own CPU kernel is scalar and single-threaded.
#pragma once

#include <string>
#include <tuple>

#include "mlx/mlx.h"

namespace mlxd {

// x (..., K) float32 times the transpose of the (N, K) weight that `w` (uint32, N rows of
// K*bits/32 words), `scales` and `biases` (N, K/group_size; float32 or float16) encode:
// w[n, k] = scales[n, k/g] * q[n, k] + biases[n, k/g]. Returns (..., N) float32.
// `w` may also be in panels, (N / R, R * K*bits/32) with R = 16 or 8 (quantized_panels,
// quantized_layout.h), which the vector loops stream in one sequence; MLX's own
// quantized ops refuse that shape rather than misread it. MLX's plain layout runs the
// scalar loop (the same bits, slowly).
//
// The weights stay packed and stream once from memory while every row of x is multiplied
// (quantized_gemv.h), each output computed in one fixed order that depends on its own row
// only. One arithmetic for every shape: a token gives the same bits alone, in a decode
// batch, or inside a prefill segment of any length, so a prompt computed in other pieces
// (after a prefix-cache hit, or with its last token split off) gives the same logits.
// (A prefill path through BLAS on dequantized panels was ~1.5x faster here but differs
// in the last bits from the decode path, which broke that equality.)
mlx::core::array quantized_matmul(
    const mlx::core::array& x,
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const mlx::core::array& biases,
    int group_size,
    int bits,
    mlx::core::StreamOrDevice s = {});

// Rows `indices` (any shape, integer) of the quantized (N, K) matrix, as float32
// (indices' shape + (K,)): the embedding lookup of a quantized model.
mlx::core::array quantized_gather(
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const mlx::core::array& biases,
    const mlx::core::array& indices,
    int group_size,
    int bits,
    mlx::core::StreamOrDevice s = {});

// "avx512-vnni", "avx-vnni", "avx2" or "scalar": the inner loop chosen for this CPU when
// the module loaded.
std::string quantized_isa();

// The panel height this CPU's loop reads (16, 8; 1: the scalar loop, no panels).
int quantized_panel_rows();

// (w, scales, biases) of MLX's layout as panels of `panel_rows` rows (quantized_layout.h):
// w as (N / R, R * K * bits / 32), scales and biases regrouped in their (N, groups) shape.
std::tuple<mlx::core::array, mlx::core::array, mlx::core::array> quantized_panels(
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const mlx::core::array& biases,
    int group_size,
    int bits,
    int panel_rows);

}  // namespace mlxd
