#include "quantized_gemv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "parallel.h"

namespace mlxd {

namespace {

constexpr int kBlock = 32;  // activation block: one float step per 32 values
// Activations are int16 in [-32767, 32767] per block: as close as fp16, and the widest
// integer that AVX2's 16-bit multiply-add (madd) takes. The previous design, two int8
// digits through the 8-bit multiply-add (maddubs), needed three multiply instructions
// per 32 products where this needs two.
constexpr float kLevels = 32767.0f;
// Activation rows kept hot in L2 while a few weight rows stream past them (prefill):
// 64 rows of 1536 int16 values are 192 KiB.
constexpr int64_t kRowChunk = 64;

// The activations of one call, quantized once and shared by every weight row.
struct Activations {
  const int16_t* q;    // M x K; 4-bit weights: each block's 16 even values, then its 16 odd ones
  const float* scale;  // M x K/32: the float value of one integer step
  const float* sums;   // M x groups: sum of the quantized x over each weight group
  int64_t blocks, groups;
};

// The eight lanes added in one fixed tree (both paths store their lanes and call this).
float reduce8(const float* v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Where value i of a block lies in its 32 quantized activations: in order for 8- and
// 5-bit weights; for 4-bit weights the evens first, then the odds, because the kernel
// splits a byte's two nibbles (values 2e and 2e+1) into two vectors.
inline int activation_slot(int i, int bits) {
  return bits == 4 ? (i & 1) * 16 + (i >> 1) : i;
}

// The 32 products of a block land in eight int32 lanes (madd adds neighbouring pairs):
// lane l holds slots 2l, 2l+1, 16+2l and 16+2l+1. The sum is an exact integer, so only
// which slots a lane holds matters, not the order they are added in.

// The weight row's group bias as it meets sum(x): 8-bit weights multiply as q - 128,
// so their offset folds into the bias.
inline float folded_bias(float scale, float bias, int bits) {
  return bits == 8 ? std::fma(scale, 128.0f, bias) : bias;
}

// ---- scalar: the reference, and what runs without AVX2 ---------------------------

// (This file builds with -ffp-contract=off: the scalar code's products and sums must
// round where the AVX2 code's do.)
void quantize_block_scalar(const float* x, int bits, int16_t* q, float* scale, float* sum) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  float d = amax / kLevels;
  float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  int total = 0;
  for (int i = 0; i < kBlock; ++i) {
    int v = static_cast<int>(std::nearbyint(x[i] * inverse));
    v = std::clamp(v, -32768, 32767);  // as AVX2's saturating pack
    q[activation_slot(i, bits)] = static_cast<int16_t>(v);
    total += v;
  }
  *scale = d;
  *sum = d * static_cast<float>(total);
}

// sum over groups of bias'(g) * sums[g]: eight lanes over whole chunks of eight, then the
// tail in order.
float bias_term_scalar(const float* bias, const float* sums, int64_t groups) {
  float lanes[8] = {};
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(bias[g + l], sums[g + l], lanes[l]);
  }
  float total = reduce8(lanes);
  for (; g < groups; ++g) total = std::fma(bias[g], sums[g], total);
  return total;
}

void row_biases_scalar(const Layout& L, const Row& r, float* dest) {
  for (int64_t g = 0; g < L.row_groups; ++g) {
    dest[g] = folded_bias(L.scale_at(r.scales, g), L.scale_at(r.biases, g), L.bits);
  }
}

void rows_scalar(const Layout& L, const uint8_t* w, const void* s, const void* b, const Activations& a, int64_t m0,
                 int64_t m1, float* out, int64_t n0, int64_t n1) {
  const int block_shift = L.group_shift - 5;
  std::vector<float> biases(L.row_groups);
  int weights[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    Row r = L.row(w, s, b, n);
    row_biases_scalar(L, r, biases.data());
    for (int64_t m = m0; m < m1; ++m) {
      const int16_t* xq = a.q + m * L.K;
      float acc[8] = {};
      for (int64_t j = 0; j < a.blocks; ++j) {
        for (int i = 0; i < kBlock; ++i) {
          int value = static_cast<int>(value_at(r.block(j), i, L.bits)) - (L.bits == 8 ? 128 : 0);
          weights[activation_slot(i, L.bits)] = value;
        }
        const int16_t* x = xq + j * kBlock;
        float c = L.scale_at(r.scales, j >> block_shift) * a.scale[m * a.blocks + j];
        for (int l = 0; l < 8; ++l) {
          int dot = weights[2 * l] * x[2 * l] + weights[2 * l + 1] * x[2 * l + 1] + weights[16 + 2 * l] * x[16 + 2 * l] +
                    weights[17 + 2 * l] * x[17 + 2 * l];
          acc[l] = std::fma(static_cast<float>(dot), c, acc[l]);
        }
      }
      out[m * L.N + n] = reduce8(acc) + bias_term_scalar(biases.data(), a.sums + m * a.groups, a.groups);
    }
  }
}

// ---- AVX2: the same integers, the same lanes, the same float operations ------------

#if defined(__x86_64__)
namespace madd_path {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define MLXD_VNNI 0
#include "quantized_tiles.inc"
#undef MLXD_VNNI
#pragma GCC pop_options
}  // namespace madd_path

namespace vnni_path {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define MLXD_VNNI 1
#include "quantized_tiles.inc"
#undef MLXD_VNNI
#pragma GCC pop_options
}  // namespace vnni_path

namespace zmm_path {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include "quantized_tiles512.inc"
#pragma GCC pop_options
}  // namespace zmm_path
#endif

enum class Isa { scalar, avx2, vnni, avx512 };

// The widest inner loop this CPU runs; MLXD_QUANTIZED_ISA=scalar|avx2|avx-vnni picks a
// narrower one (the tests compare them: all give the same bits).
Isa isa() {
#if defined(__x86_64__)
  static const Isa chosen = [] {
    const char* forced = std::getenv("MLXD_QUANTIZED_ISA");
    std::string cap = forced ? forced : "";
    if (cap == "scalar") return Isa::scalar;
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) {
      return Isa::scalar;
    }
    if (cap == "avx2") return Isa::avx2;
    if (cap != "avx-vnni" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni")) {
      return Isa::avx512;
    }
    if (__builtin_cpu_supports("avxvnni")) return Isa::vnni;
    return Isa::avx2;
  }();
  return chosen;
#else
  return Isa::scalar;
#endif
}

using RowsFn = void (*)(const Layout&, const uint8_t*, const void*, const void*, const Activations&, int64_t,
                        int64_t, float*, int64_t, int64_t);

// The loop that computes a block of outputs on this path, for this weight width.
RowsFn rows_for(Isa path, int bits) {
#if defined(__x86_64__)
  if (path == Isa::avx512) {
    return bits == 4 ? zmm_path::rows_avx512<4> : bits == 5 ? zmm_path::rows_avx512<5> : zmm_path::rows_avx512<8>;
  }
  if (path == Isa::vnni) {
    return bits == 4 ? vnni_path::rows_avx2<4> : bits == 5 ? vnni_path::rows_avx2<5> : vnni_path::rows_avx2<8>;
  }
  if (path == Isa::avx2) {
    return bits == 4 ? madd_path::rows_avx2<4> : bits == 5 ? madd_path::rows_avx2<5> : madd_path::rows_avx2<8>;
  }
#endif
  return rows_scalar;
}

}  // namespace

const char* gemv_isa() {
  switch (isa()) {
    case Isa::avx512: return "avx512-vnni";
    case Isa::vnni: return "avx-vnni";
    case Isa::avx2: return "avx2";
    default: return "scalar";
  }
}

int gemv_tile_rows() {
  switch (isa()) {
    case Isa::avx512: return 4;
    case Isa::vnni:
    case Isa::avx2: return 2;
    default: return 1;
  }
}

void gemv(const Layout& L, const uint8_t* w, const void* scales, const void* biases, const float* x, int64_t M,
          float* out) {
  const int64_t blocks = L.K / kBlock, groups = L.row_groups;
  const int blocks_per_group = 1 << (L.group_shift - 5);
  // Per-thread scratch of the calling (MLX stream) thread; the helpers only read it.
  thread_local std::vector<int16_t> q;
  thread_local std::vector<float> scale, block_sums, sums;
  q.resize(M * L.K);
  scale.resize(M * blocks);
  block_sums.resize(M * blocks);
  sums.resize(M * groups);
  const Isa path = isa();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < blocks; ++j) {
      const float* src = x + m * L.K + kBlock * j;
      int16_t* dest = q.data() + m * L.K + kBlock * j;
#if defined(__x86_64__)
      if (path != Isa::scalar) {
        madd_path::quantize_block_avx2(src, L.bits, dest, &scale[m * blocks + j], &block_sums[m * blocks + j]);
        continue;
      }
#endif
      quantize_block_scalar(src, L.bits, dest, &scale[m * blocks + j], &block_sums[m * blocks + j]);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* part = &block_sums[m * blocks + g * blocks_per_group];
      float total = part[0];
      for (int i = 1; i < blocks_per_group; ++i) total += part[i];
      sums[m * groups + g] = total;
    }
  }
  Activations a{q.data(), scale.data(), sums.data(), blocks, groups};
  // Items of a few weight rows each, so both cores share even small projections; long
  // prefills also split the activation rows into chunks that stay in L2 while the
  // item's weight rows pass over them. Every output is one (row, column) pair computed
  // whole by one item, so the split never changes a bit.
  const RowsFn rows = rows_for(path, L.bits);
  // Items are contiguous runs of up to 256 rows (a multiple of 4, so tiles stay whole),
  // about eight per thread: a thread then streams long runs of memory. Runs of 16 rows,
  // which the two threads took in turn, read a 136 MB lm_head at half the speed.
  const int64_t rows_per_item = std::max<int64_t>(2, std::min<int64_t>(256, L.N / (8 * kernel_threads())) & ~int64_t{3});
  const int64_t row_items = (L.N + rows_per_item - 1) / rows_per_item;
  const int64_t chunks = (M + kRowChunk - 1) / kRowChunk;
  parallel_for(row_items * chunks, static_cast<double>(L.N) * L.K * std::max<int64_t>(M, 2) / 4, [&](int64_t item) {
    const int64_t chunk = item / row_items, rows_item = item % row_items;
    const int64_t n0 = rows_item * rows_per_item, n1 = std::min(L.N, n0 + rows_per_item);
    const int64_t m0 = chunk * kRowChunk, m1 = std::min(M, m0 + kRowChunk);
    rows(L, w, scales, biases, a, m0, m1, out, n0, n1);
  });
}

}  // namespace mlxd
