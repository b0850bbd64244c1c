// The quantized matmul's arithmetic, for decode and prefill alike: rows of activations
// against weights that stay packed, read once per call (per 64-row chunk in prefill).
#pragma once

#include <cstdint>

#include "quantized_layout.h"

namespace mlxd {

// out[m, n] = sum_k x[m, k] * w[n, k] for the M rows of x (M x K floats, row-major).
//
// Like llama.cpp, each row of x is first quantized to integers in blocks of 32 (one
// float step per block), so the weights' integers meet it in integer multiply-adds and
// are never converted to floats; the group biases meet the sums of the same quantized
// x, so the result is sum_k w[n, k] * xq[m, k] up to float rounding. Unlike llama.cpp's
// int8 (Q8), xq is int16 (~15 bits), as close as fp16. Every output is accumulated in one
// fixed order that depends on its own row of x only (whatever loop, panel or chunk
// computes it; quantized_gemv.cpp states it): a row gives the same bits alone, in any
// batch, and on every path. Weights in panels (Layout::panel_rows of this CPU's loop)
// run the vector loops; MLX's plain layout runs the scalar loop.
void gemv(const Layout& L, const uint8_t* w, const void* scales, const void* biases, const float* x, int64_t M,
          float* out);

// "avx512-vnni", "avx-vnni", "avx2" or "scalar": the inner loop chosen for this CPU.
const char* gemv_isa();

// The panel height that loop reads (16 for AVX-512, 8 for AVX2; 1: no panels, the
// scalar loop reads MLX's layout).
int gemv_panel_rows();

// MLX's (N, K) layout `plain` as panels of `panel_rows` rows (N a multiple of it): the
// packed values into `panel_w` (as many bytes as w), scales and biases regrouped.
void repack_panels(const Layout& plain, const uint8_t* w, const void* scales, const void* biases, int panel_rows,
                   uint8_t* panel_w, void* panel_scales, void* panel_biases);

}  // namespace mlxd
