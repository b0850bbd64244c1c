// The decode path of the quantized matmul: a few rows of activations against weights
// that stay packed, read once per call.
#pragma once

#include <cstdint>

#include "quantized_layout.h"

namespace mlxd {

// out[m, n] = sum_k x[m, k] * w[n, k] for the M rows of x (M x K floats, row-major).
//
// Like llama.cpp, each row of x is first quantized to integers in blocks of 32 (one
// float step per block), so the weights' integers meet it in integer multiply-adds
// (AVX2 madd) and are never converted to floats; the group biases meet the sums of the
// same quantized x, so the result is sum_k w[n, k] * xq[m, k] up to float rounding.
// Unlike llama.cpp's int8 (Q8), xq is int16 (~15 bits): int8 moved SmolLM2's greedy
// answer, int16 leaves it as fp32 gives it. Every output is accumulated in one fixed
// order that depends on its own row of x only (whatever tile or chunk computes it), and
// the scalar path reproduces the AVX2 lanes exactly: a row gives the same bits alone,
// in any batch, and on either path.
void gemv(const Layout& L, const uint8_t* w, const void* scales, const void* biases, const float* x, int64_t M,
          float* out);

// "avx512-vnni", "avx-vnni", "avx2" or "scalar": the inner loop chosen for this CPU.
const char* gemv_isa();

// The weight rows that loop reads together (4, 2, or 1 for the scalar loop): weights
// tiled by as many rows (Layout::tile_rows) stream from memory in one sequence.
int gemv_tile_rows();

}  // namespace mlxd
