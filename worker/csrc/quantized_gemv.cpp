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

// Where value i of a block lies in its 32 quantized activations: in order for 8-bit
// weights; for 4-bit weights the evens first, then the odds, because the kernel splits
// a byte's two nibbles (values 2e and 2e+1) into two vectors.
inline int activation_slot(int i, int bits) {
  return bits == 8 ? i : (i & 1) * 16 + (i >> 1);
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
          int value = L.bits == 4 ? (r.q[16 * j + (i >> 1)] >> ((i & 1) * 4)) & 0xF
                                  : static_cast<int>(r.q[32 * j + i]) - 128;
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
#define MLXD_AVX2 __attribute__((target("avx2,fma,f16c")))

MLXD_AVX2 inline int hsum_epi32(__m256i v) {
  __m128i four = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, _MM_SHUFFLE(1, 0, 3, 2)));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(four);
}

MLXD_AVX2 void quantize_block_avx2(const float* x, int bits, int16_t* q, float* scale, float* sum) {
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
  if (bits == 4) {  // evens then odds: split each 16-value vector and regroup
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    // per 128-bit half: [4 evens | 4 odds] of 8 values; then 64-bit lanes (E0 O0 E1 O1)
    __m256i a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(first, split), _MM_SHUFFLE(3, 1, 2, 0));
    __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(second, split), _MM_SHUFFLE(3, 1, 2, 0));
    first = _mm256_permute2x128_si256(a, b, 0x20);   // evens of values 0-15, then of 16-31
    second = _mm256_permute2x128_si256(a, b, 0x31);  // odds likewise
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), first);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), second);
  *scale = d;
  *sum = d * static_cast<float>(hsum_epi32(total));
}

// reduce8's tree on a register: hadd pairs (v0+v1, v2+v3), hadd again, add the halves.
MLXD_AVX2 inline float reduce8_avx2(__m256 v) {
  __m256 pairs = _mm256_hadd_ps(v, v);
  __m256 quads = _mm256_hadd_ps(pairs, pairs);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
}

MLXD_AVX2 inline __m256 load_scales8(const Layout& L, const void* p, int64_t g) {
  if (L.half_scales) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + g)));
  }
  return _mm256_loadu_ps(static_cast<const float*>(p) + g);
}

MLXD_AVX2 inline float scale1(const Layout& L, const void* p, int64_t g) {
  return L.half_scales ? _cvtsh_ss(static_cast<const uint16_t*>(p)[g]) : static_cast<const float*>(p)[g];
}

MLXD_AVX2 float bias_term_avx2(const float* bias, const float* sums, int64_t groups) {
  __m256 lanes = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) lanes = _mm256_fmadd_ps(_mm256_loadu_ps(bias + g), _mm256_loadu_ps(sums + g), lanes);
  float total = reduce8_avx2(lanes);
  for (; g < groups; ++g) total = std::fma(bias[g], sums[g], total);
  return total;
}

// The row's folded group biases and its scale for every block, as floats.
MLXD_AVX2 void row_floats(const Layout& L, const Row& r, int64_t blocks, float* biases, float* block_scales) {
  const int64_t groups = L.row_groups;
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 s = load_scales8(L, r.scales, g), b = load_scales8(L, r.biases, g);
    if (L.bits == 8) b = _mm256_fmadd_ps(s, _mm256_set1_ps(128.0f), b);
    _mm256_storeu_ps(biases + g, b);
    if (L.group_shift == 5) _mm256_storeu_ps(block_scales + g, s);
  }
  for (; g < groups; ++g) {
    float s = scale1(L, r.scales, g);
    biases[g] = folded_bias(s, scale1(L, r.biases, g), L.bits);
    if (L.group_shift == 5) block_scales[g] = s;
  }
  if (L.group_shift == 5) return;  // a block is a group
  const int shift = L.group_shift - 5;
  for (int64_t j = 0; j < blocks; ++j) block_scales[j] = scale1(L, r.scales, j >> shift);
}

// c[t][j] = sg[j] * dx[m0 + t][j]: each block's float step for each activation row.
template <int MT>
MLXD_AVX2 inline void block_steps(const float* sg, const Activations& a, int64_t m0, float* c, int64_t pitch) {
  const int64_t blocks = a.blocks;
  int64_t j = 0;
  for (; j + 8 <= blocks; j += 8) {
    __m256 s = _mm256_loadu_ps(sg + j);
    for (int t = 0; t < MT; ++t) {
      _mm256_storeu_ps(c + t * pitch + j, _mm256_mul_ps(s, _mm256_loadu_ps(a.scale + (m0 + t) * blocks + j)));
    }
  }
  for (; j < blocks; ++j) {
    for (int t = 0; t < MT; ++t) c[t * pitch + j] = sg[j] * a.scale[(m0 + t) * blocks + j];
  }
}

// One block of a weight row as two vectors of 16 int16: slots 0-15 and 16-31.
template <int Bits>
MLXD_AVX2 inline void unpack_block(const uint8_t* q, int64_t j, __m256i& low, __m256i& high) {
  if constexpr (Bits == 4) {
    // one byte per int16, then its two nibbles: value 2e (low) and 2e+1 (high)
    __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * j)));
    low = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
    high = _mm256_srli_epi16(v, 4);
  } else {
    __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j)),
                                 _mm256_set1_epi8(static_cast<char>(0x80)));  // q - 128 as int8
    low = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    high = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
  }
}

// NR weight rows against MT activation rows, accumulators in registers. `steps` holds
// the block steps of row r, activation t at (r * MT + t) * pitch.
template <int Bits, int NR, int MT>
MLXD_AVX2 void tile(const Row* rows, const Activations& a, int64_t K, int64_t m0, const float* steps, int64_t pitch,
                    float* out_lanes) {
  __m256 acc[NR][MT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < MT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < a.blocks; ++j) {
    __m256i low[NR], high[NR];
    for (int r = 0; r < NR; ++r) unpack_block<Bits>(rows[r].q, j, low[r], high[r]);
    for (int t = 0; t < MT; ++t) {
      const int16_t* x = a.q + (m0 + t) * K + j * kBlock;
      __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
      __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
      for (int r = 0; r < NR; ++r) {
        __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(low[r], x0), _mm256_madd_epi16(high[r], x1));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(steps + (r * MT + t) * pitch + j),
                                    acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < MT; ++t) out_lanes[r * MT + t] = reduce8_avx2(acc[r][t]);
  }
}

// Scratch of one thread: per weight row its folded biases and block scales, and the
// block steps of a tile.
struct Scratch {
  std::vector<float> biases, scales, steps;
};

template <int Bits, int NR>
MLXD_AVX2 void rows_tile(const Layout& L, const Row* rows, const Activations& a, int64_t m0, int64_t m1,
                         float* out, int64_t n, Scratch& scratch) {
  constexpr int MT = 4;
  const int64_t pitch = a.blocks;
  const int64_t groups = a.groups;
  for (int r = 0; r < NR; ++r) {
    row_floats(L, rows[r], a.blocks, scratch.biases.data() + r * groups, scratch.scales.data() + r * a.blocks);
  }
  float lanes[NR * MT];
  for (int64_t m = m0; m < m1; m += MT) {
    const int64_t count = std::min<int64_t>(MT, m1 - m);
    float* steps = scratch.steps.data();
    auto run = [&](auto mt) {
      constexpr int T = decltype(mt)::value;
      for (int r = 0; r < NR; ++r) {
        block_steps<T>(scratch.scales.data() + r * a.blocks, a, m, steps + r * T * pitch, pitch);
      }
      tile<Bits, NR, T>(rows, a, L.K, m, steps, pitch, lanes);
      for (int r = 0; r < NR; ++r) {
        for (int t = 0; t < T; ++t) {
          out[(m + t) * L.N + n + r] =
              lanes[r * T + t] + bias_term_avx2(scratch.biases.data() + r * groups, a.sums + (m + t) * groups, groups);
        }
      }
    };
    switch (count) {
      case 1: run(std::integral_constant<int, 1>{}); break;
      case 2: run(std::integral_constant<int, 2>{}); break;
      case 3: run(std::integral_constant<int, 3>{}); break;
      default: run(std::integral_constant<int, MT>{}); break;
    }
  }
}

template <int Bits>
MLXD_AVX2 void rows_avx2(const Layout& L, const uint8_t* w, const void* s, const void* b, const Activations& a,
                         int64_t m0, int64_t m1, float* out, int64_t n0, int64_t n1) {
  thread_local Scratch scratch;
  scratch.biases.resize(2 * a.groups);
  scratch.scales.resize(2 * a.blocks);
  scratch.steps.resize(2 * 4 * a.blocks);
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    Row rows[2] = {L.row(w, s, b, n), L.row(w, s, b, n + 1)};
    rows_tile<Bits, 2>(L, rows, a, m0, m1, out, n, scratch);
  }
  if (n < n1) {
    Row rows[1] = {L.row(w, s, b, n)};
    rows_tile<Bits, 1>(L, rows, a, m0, m1, out, n, scratch);
  }
}
#endif

bool use_avx2() {
#if defined(__x86_64__)
  static const bool supported = [] {
    if (const char* forced = std::getenv("MLXD_QUANTIZED_ISA"); forced && std::string(forced) == "scalar") {
      return false;  // tests compare the two paths
    }
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return supported;
#else
  return false;
#endif
}

}  // namespace

const char* gemv_isa() {
  return use_avx2() ? "avx2" : "scalar";
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
  const bool avx2 = use_avx2();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < blocks; ++j) {
      const float* src = x + m * L.K + kBlock * j;
      int16_t* dest = q.data() + m * L.K + kBlock * j;
#if defined(__x86_64__)
      if (avx2) {
        quantize_block_avx2(src, L.bits, dest, &scale[m * blocks + j], &block_sums[m * blocks + j]);
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
  const int64_t rows_per_item = std::max<int64_t>(2, std::min<int64_t>(16, L.N / (8 * kernel_threads())) & ~int64_t{1});
  const int64_t row_items = (L.N + rows_per_item - 1) / rows_per_item;
  const int64_t chunks = (M + kRowChunk - 1) / kRowChunk;
  parallel_for(row_items * chunks, static_cast<double>(L.N) * L.K * std::max<int64_t>(M, 2) / 4, [&](int64_t item) {
    const int64_t chunk = item / row_items, rows_item = item % row_items;
    const int64_t n0 = rows_item * rows_per_item, n1 = std::min(L.N, n0 + rows_per_item);
    const int64_t m0 = chunk * kRowChunk, m1 = std::min(M, m0 + kRowChunk);
#if defined(__x86_64__)
    if (avx2) {
      if (L.bits == 4) {
        rows_avx2<4>(L, w, scales, biases, a, m0, m1, out, n0, n1);
      } else {
        rows_avx2<8>(L, w, scales, biases, a, m0, m1, out, n0, n1);
      }
      return;
    }
#endif
    rows_scalar(L, w, scales, biases, a, m0, m1, out, n0, n1);
  });
}

}  // namespace mlxd
