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
// integer that a 16-bit multiply-add takes.
constexpr float kLevels = 32767.0f;
// Activation rows kept hot in L2 while the panels of an item stream past them (prefill):
// 64 rows of 1536 int16 values are 192 KiB.
constexpr int64_t kRowChunk = 64;
// Activation rows a panel pass multiplies at once (accumulators in registers).
constexpr int kPassRows = 8;

// The activations of one call, quantized once and shared by every weight row.
struct Activations {
  const int16_t* q;    // M x K, in order
  const float* scale;  // M x K/32: the float value of one integer step
  const float* sums;   // M x groups: sum of the quantized x over each weight group
  int64_t blocks, groups;
};

// Every output out[m, n] is, on every path and for any M or panel:
//   acc = 0; for each block j in order: acc = fma(float(dot_j), scale_w(n, j) * step(m, j), acc)
//   bias = 0; for each group g in order: bias = fma(bias_w(n, g), sums(m, g), bias)
//   out = acc + bias
// where dot_j is the exact integer sum of the block's 32 products q * xq. Only how the
// exact integers are gathered differs between the loops, so all of them give the same
// bits, and a row gives the same bits alone, in a batch, or in a prefill segment.

// (This file builds with -ffp-contract=off: the scalar code's products and sums must
// round where the vector code's do.)
void quantize_block_scalar(const float* x, int16_t* q, float* scale, float* sum) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  float d = amax / kLevels;
  float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  int total = 0;
  for (int i = 0; i < kBlock; ++i) {
    int v = static_cast<int>(std::nearbyint(x[i] * inverse));
    v = std::clamp(v, -32768, 32767);  // as AVX2's saturating pack
    q[i] = static_cast<int16_t>(v);
    total += v;
  }
  *scale = d;
  *sum = d * static_cast<float>(total);
}

// ---- scalar: the reference, and what runs without AVX2 or for layouts the vector loops
// do not read (MLX's own, or panels of another height) ----------------------------------

void rows_scalar(const Layout& L, const uint8_t* w, const void* s, const void* b, const Activations& a, int64_t m0,
                 int64_t m1, float* out, int64_t n0, int64_t n1) {
  const int block_shift = L.group_shift - 5;
  std::vector<int> q(L.K);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < L.K; ++k) q[k] = static_cast<int>(L.value(w, n, k));
    for (int64_t m = m0; m < m1; ++m) {
      const int16_t* x = a.q + m * L.K;
      float acc = 0.0f;
      for (int64_t j = 0; j < a.blocks; ++j) {
        int dot = 0;
        for (int i = 0; i < kBlock; ++i) dot += q[kBlock * j + i] * x[kBlock * j + i];
        float c = L.scale_at(s, L.group_index(n, j >> block_shift)) * a.scale[m * a.blocks + j];
        acc = std::fma(static_cast<float>(dot), c, acc);
      }
      float bias = 0.0f;
      for (int64_t g = 0; g < a.groups; ++g) bias = std::fma(L.scale_at(b, L.group_index(n, g)), a.sums[m * a.groups + g], bias);
      out[m * L.N + n] = acc + bias;
    }
  }
}

#if defined(__x86_64__)
namespace ymm_path {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define MLXD_VNNI 0
#include "quantized_panel256.inc"
#undef MLXD_VNNI
#pragma GCC pop_options
}  // namespace ymm_path

namespace vnni_path {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define MLXD_VNNI 1
#include "quantized_panel256.inc"
#undef MLXD_VNNI
#pragma GCC pop_options
}  // namespace vnni_path

namespace zmm_path {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include "quantized_panel512.inc"
#pragma GCC pop_options
}  // namespace zmm_path

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
// The AVX2 quantizer: the scalar one's integers, steps and sums.
void quantize_block_avx2(const float* x, int16_t* q, float* scale, float* sum) {
  __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
                           _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float amax = _mm_cvtss_f32(m4);
  float d = amax / kLevels;
  float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  __m256 id = _mm256_set1_ps(inverse);
  __m256i i[4];
  __m256i total = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    // cvtps rounds to nearest even, as nearbyint does in the default rounding mode
    i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
    total = _mm256_add_epi32(total, i[k]);
  }
  // packs interleaves 128-bit halves: (0-3, 8-11, 4-7, 12-15) -> put them in order
  __m256i first = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), _MM_SHUFFLE(3, 1, 2, 0));
  __m256i second = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), _MM_SHUFFLE(3, 1, 2, 0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), first);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), second);
  __m128i four = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, _MM_SHUFFLE(1, 0, 3, 2)));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, _MM_SHUFFLE(2, 3, 0, 1)));
  *scale = d;
  *sum = d * static_cast<float>(_mm_cvtsi128_si32(four));
}
#pragma GCC pop_options
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

template <template <int> class Loop>
RowsFn by_bits(int bits) {
  return bits == 4 ? Loop<4>::run : bits == 5 ? Loop<5>::run : Loop<8>::run;
}

// The loop that computes a block of outputs for this layout on this CPU: the panel
// loops read their own panel height only; everything else runs the scalar loop.
RowsFn rows_for(Isa path, const Layout& L) {
#if defined(__x86_64__)
  if (L.panel_rows == 16 && path == Isa::avx512) return by_bits<zmm_path::Panels>(L.bits);
  if (L.panel_rows == 8 && path == Isa::vnni) return by_bits<vnni_path::Panels>(L.bits);
  // (AVX-512 VNNI does not imply AVX-VNNI's VEX form: Zen 4 has the one, not the other)
  if (L.panel_rows == 8 && path != Isa::scalar) return by_bits<ymm_path::Panels>(L.bits);
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

int gemv_panel_rows() {
  switch (isa()) {
    case Isa::avx512: return 16;
    case Isa::vnni:
    case Isa::avx2: return 8;
    default: return 1;
  }
}

void repack_panels(const Layout& plain, const uint8_t* w, const void* scales, const void* biases, int panel_rows,
                   uint8_t* panel_w, void* panel_scales, void* panel_biases) {
  Layout P = plain;
  P.panel_rows = panel_rows;
  const int64_t R = panel_rows, blocks = plain.blocks(), vector_bytes = 4 * R;
  const int64_t scale_bytes = plain.half_scales ? 2 : 4;
  parallel_for(plain.N / R, static_cast<double>(plain.N) * plain.K, [&](int64_t panel) {
    for (int64_t j = 0; j < blocks; ++j) {
      uint8_t* run = const_cast<uint8_t*>(P.panel_block(panel_w, panel, j));
      std::fill(run, run + plain.block_bytes() * R, 0);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t n = panel * R + r;
        for (int i = 0; i < kBlock; ++i) {
          const uint32_t v = plain.value(w, n, kBlock * j + i);
          const int p = i >> 1;
          const int64_t word = 2 * r + (i & 1);
          auto put = [&](int vector, uint32_t bits_at) {
            uint16_t old;
            std::memcpy(&old, run + vector * vector_bytes + 2 * word, sizeof(old));
            old = static_cast<uint16_t>(old | bits_at);
            std::memcpy(run + vector * vector_bytes + 2 * word, &old, sizeof(old));
          };
          if (plain.bits == 8) {
            put(p >> 1, v << (8 * (p & 1)));
          } else {
            put(p >> 2, (v & 0xF) << (4 * (p & 3)));
            if (plain.bits == 5) put(4, ((v >> 4) & 1) << p);
          }
        }
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t n = panel * R + r;
      for (int64_t g = 0; g < plain.row_groups; ++g) {
        std::memcpy(static_cast<char*>(panel_scales) + P.group_index(n, g) * scale_bytes,
                    static_cast<const char*>(scales) + plain.group_index(n, g) * scale_bytes, scale_bytes);
        std::memcpy(static_cast<char*>(panel_biases) + P.group_index(n, g) * scale_bytes,
                    static_cast<const char*>(biases) + plain.group_index(n, g) * scale_bytes, scale_bytes);
      }
    }
  });
}

void gemv(const Layout& L, const uint8_t* w, const void* scales, const void* biases, const float* x, int64_t M,
          float* out) {
  const int64_t blocks = L.blocks(), groups = L.row_groups;
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
        quantize_block_avx2(src, dest, &scale[m * blocks + j], &block_sums[m * blocks + j]);
        continue;
      }
#endif
      quantize_block_scalar(src, dest, &scale[m * blocks + j], &block_sums[m * blocks + j]);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* part = &block_sums[m * blocks + g * blocks_per_group];
      float total = part[0];
      for (int i = 1; i < blocks_per_group; ++i) total += part[i];
      sums[m * groups + g] = total;
    }
  }
  Activations a{q.data(), scale.data(), sums.data(), blocks, groups};
  // Items are contiguous runs of up to 256 rows (whole panels), about eight per thread:
  // a thread then streams long runs of memory. Long prefills also split the activation
  // rows into chunks that stay in L2 while the item's panels pass over them. Every
  // output is one (row, column) pair computed whole by one item, so the split never
  // changes a bit.
  const RowsFn rows = rows_for(path, L);
  const int64_t unit = L.panel_rows;
  const int64_t per_item = std::clamp<int64_t>(L.N / (8 * kernel_threads()), 1, 256);
  const int64_t rows_per_item = std::max<int64_t>(unit, per_item / unit * unit);
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
