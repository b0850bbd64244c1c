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

constexpr int kBlock = 32;  // activation block: one int8 scale per 32 values
// Activations are two int8 digits, x ~ d * (q + r / 254): one digit alone (llama.cpp's Q8)
// moved SmolLM2's greedy answer; two keep ~15 bits, as close as fp16.
constexpr float kSecondDigit = 254.0f;
constexpr float kSecondDigitStep = 1.0f / 254.0f;

// The activations of one call, quantized once and shared by every weight row.
struct Activations {
  const int8_t* q;      // M x K first digits; 4-bit weights: each block's even values, then its odd ones
  const int8_t* r;      // M x K second digits, laid out as q
  const float* scale;   // M x K/32: the float value of one int8 step
  const float* sums;    // M x groups: sum of the quantized x over each weight group
  int64_t blocks, groups;
};

// The eight lanes added in one fixed tree (both paths store their lanes and call this).
float reduce8(const float* v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Where value i of block j of a row lies in the quantized activations. 8-bit weights:
// in order. 4-bit weights: blocks go in pairs of 64 bytes, [evens of j, evens of j+1,
// odds of j, odds of j+1] (a last unpaired block: [evens, odds]), because the kernel
// splits one 32-byte load of two blocks' nibbles into their low (even) and high (odd)
// values.
inline int64_t activation_index(int64_t j, int i, int64_t blocks, int bits) {
  if (bits == 8) return j * kBlock + i;
  int64_t base = (j >> 1) * 64;
  int half = (i & 1) ? 1 : 0;  // odd values in the second half
  int offset = i >> 1;
  if ((j | 1) < blocks) return base + half * 32 + (j & 1) * 16 + offset;  // in a full pair
  return base + half * 16 + offset;
}

// Lanes of the 8-float accumulator each block feeds: 8-bit blocks feed all eight lanes
// (lane l: values 4l..4l+3); 4-bit blocks feed four (lane l: values 8l..8l+7), the
// even block of a pair lanes 0-3, the odd one lanes 4-7.

// ---- scalar: the reference, and what runs without AVX2 ---------------------------

// (This file builds with -ffp-contract=off: the scalar code's products and sums must
// round where the AVX2 code's do.)
void quantize_block_scalar(const float* x, int64_t j, int64_t blocks, int bits, int8_t* row_q, int8_t* row_r,
                           float* scale, float* sum) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  float d = amax / 127.0f;
  float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  int first = 0, second = 0;
  for (int i = 0; i < kBlock; ++i) {
    float v = x[i] * inverse;
    float q = std::nearbyint(v);
    float r = std::nearbyint((v - q) * kSecondDigit);
    int64_t at = activation_index(j, i, blocks, bits);
    row_q[at] = static_cast<int8_t>(q);
    row_r[at] = static_cast<int8_t>(r);
    first += static_cast<int>(q);
    second += static_cast<int>(r);
  }
  *scale = d;
  *sum = d * std::fma(static_cast<float>(second), kSecondDigitStep, static_cast<float>(first));
}

// sum over groups of bias'(g) * sums[g]: eight lanes over whole chunks of eight, then the
// tail in order. bias' folds the 8-bit weights' offset in (they multiply as q - 128).
float bias_term_scalar(const Layout& L, const Row& r, const float* sums, int64_t groups) {
  float lanes[8] = {};
  int64_t g = 0;
  auto bias = [&](int64_t i) {
    float b = L.scale_at(r.biases, i);
    return L.bits == 8 ? std::fma(L.scale_at(r.scales, i), 128.0f, b) : b;
  };
  for (; g + 8 <= groups; g += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(bias(g + l), sums[g + l], lanes[l]);
  }
  float total = reduce8(lanes);
  for (; g < groups; ++g) total = std::fma(bias(g), sums[g], total);
  return total;
}

void rows_scalar(const Layout& L, const uint8_t* w, const void* s, const void* b, const Activations& a, int64_t M,
                 float* out, int64_t n0, int64_t n1) {
  const int block_shift = L.group_shift - 5;
  std::vector<float> acc(M * 8);
  int weights[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    Row r = L.row(w, s, b, n);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < a.blocks; ++j) {
      float sg = L.scale_at(r.scales, j >> block_shift);
      for (int i = 0; i < kBlock; ++i) {
        weights[i] = L.bits == 4 ? (r.q[16 * j + (i >> 1)] >> ((i & 1) * 4)) & 0xF
                                 : static_cast<int>(r.q[32 * j + i]) - 128;
      }
      for (int64_t m = 0; m < M; ++m) {
        const int8_t* xq = a.q + m * L.K;
        const int8_t* xr = a.r + m * L.K;
        float c = sg * a.scale[m * a.blocks + j];
        int width = L.bits == 4 ? 8 : 4, first_lane = L.bits == 4 ? (j & 1) * 4 : 0;
        for (int l = 0; l < kBlock / width; ++l) {
          int first = 0, second = 0;
          for (int t = 0; t < width; ++t) {
            int i = l * width + t;
            int64_t at = activation_index(j, i, a.blocks, L.bits);
            first += weights[i] * xq[at];
            second += weights[i] * xr[at];
          }
          float dot = std::fma(static_cast<float>(second), kSecondDigitStep, static_cast<float>(first));
          float& lane = acc[m * 8 + first_lane + l];
          lane = std::fma(dot, c, lane);
        }
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      out[m * L.N + n] = reduce8(&acc[m * 8]) + bias_term_scalar(L, r, a.sums + m * a.groups, a.groups);
    }
  }
}

// ---- AVX2: the same integers, the same lanes, the same float operations ------------

#if defined(__x86_64__)
#define MLXD_AVX2 __attribute__((target("avx2,fma,f16c")))

// Four vectors of int32 (32 values in order) as int8 at their places in the row.
MLXD_AVX2 inline void store_digits(__m256i i0, __m256i i1, __m256i i2, __m256i i3, int64_t j, int64_t blocks,
                                   int bits, int8_t* row) {
  __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // values in order
  if (bits == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + j * kBlock), packed);
    return;
  }
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  // [evens (16) | odds (16)] of this block
  __m256i halves = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(packed, split), _MM_SHUFFLE(3, 1, 2, 0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(row + activation_index(j, 0, blocks, bits)),
                   _mm256_castsi256_si128(halves));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(row + activation_index(j, 1, blocks, bits)),
                   _mm256_extracti128_si256(halves, 1));
}

MLXD_AVX2 inline int hsum_epi32(__m256i v) {
  __m128i four = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, _MM_SHUFFLE(1, 0, 3, 2)));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(four);
}

MLXD_AVX2 void quantize_block_avx2(const float* x, int64_t j, int64_t blocks, int bits, int8_t* row_q, int8_t* row_r,
                                   float* scale, float* sum) {
  __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
  __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, magnitude), _mm256_and_ps(v1, magnitude)),
                           _mm256_max_ps(_mm256_and_ps(v2, magnitude), _mm256_and_ps(v3, magnitude)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float amax = _mm_cvtss_f32(m4);
  float d = amax / 127.0f;
  float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  __m256 id = _mm256_set1_ps(inverse);
  const __m256 digit = _mm256_set1_ps(kSecondDigit);
  __m256i q[4], r[4];
  const __m256 v[4] = {v0, v1, v2, v3};
  __m256i first = _mm256_setzero_si256(), second = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    __m256 scaled = _mm256_mul_ps(v[k], id);
    __m256 rounded = _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[k] = _mm256_cvtps_epi32(rounded);
    r[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(scaled, rounded), digit));
    first = _mm256_add_epi32(first, q[k]);
    second = _mm256_add_epi32(second, r[k]);
  }
  store_digits(q[0], q[1], q[2], q[3], j, blocks, bits, row_q);
  store_digits(r[0], r[1], r[2], r[3], j, blocks, bits, row_r);
  *scale = d;
  *sum = d * std::fma(static_cast<float>(hsum_epi32(second)), kSecondDigitStep, static_cast<float>(hsum_epi32(first)));
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

MLXD_AVX2 float bias_term_avx2(const Layout& L, const Row& r, const float* sums, int64_t groups) {
  __m256 lanes = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 b = load_scales8(L, r.biases, g);
    if (L.bits == 8) b = _mm256_fmadd_ps(load_scales8(L, r.scales, g), _mm256_set1_ps(128.0f), b);
    lanes = _mm256_fmadd_ps(b, _mm256_loadu_ps(sums + g), lanes);
  }
  float total = reduce8_avx2(lanes);
  for (; g < groups; ++g) {
    float b = scale1(L, r.biases, g);
    if (L.bits == 8) b = std::fma(scale1(L, r.scales, g), 128.0f, b);
    total = std::fma(b, sums[g], total);
  }
  return total;
}

// The row's group scale for every block, as floats (gs > 32 only: for gs = 32 the
// scales are the blocks' and are read directly).
MLXD_AVX2 void block_scales(const Layout& L, const Row& r, int64_t blocks, float* dest) {
  const int shift = L.group_shift - 5;
  for (int64_t j = 0; j < blocks; ++j) dest[j] = scale1(L, r.scales, j >> shift);
}

// c[t][j] = sg[j] * dx[m0 + t][j]: each block's float step for each activation row.
// Rows of 8+ blocks end with one vector over the last eight (recomputing a few equal
// products) rather than a scalar tail.
template <int MT>
MLXD_AVX2 inline void block_steps(const Layout& L, const Row& r, const float* sg, const Activations& a, int64_t m0,
                                  float* c, int64_t pitch) {
  const int64_t blocks = a.blocks;
  auto scales8 = [&](int64_t j) { return L.group_shift == 5 ? load_scales8(L, r.scales, j) : _mm256_loadu_ps(sg + j); };
  auto scale = [&](int64_t j) { return L.group_shift == 5 ? scale1(L, r.scales, j) : sg[j]; };
  if (blocks < 8) {
    for (int t = 0; t < MT; ++t) {
      for (int64_t j = 0; j < blocks; ++j) c[t * pitch + j] = scale(j) * a.scale[(m0 + t) * blocks + j];
    }
    return;
  }
  for (int64_t j = 0;; j += 8) {
    int64_t at = std::min(j, blocks - 8);
    __m256 s = scales8(at);
    for (int t = 0; t < MT; ++t) {
      _mm256_storeu_ps(c + t * pitch + at, _mm256_mul_ps(s, _mm256_loadu_ps(a.scale + (m0 + t) * blocks + at)));
    }
    if (at == blocks - 8) break;
  }
}

// One weight row against a tile of MT activation rows, accumulators in registers.
template <int MT>
MLXD_AVX2 void tile4(const Layout& L, const Row& r, const float* sg, const Activations& a, int64_t m0,
                     float* steps, float* out_lanes) {
  const int64_t blocks = a.blocks;
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i pair_steps = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256 step = _mm256_set1_ps(kSecondDigitStep);
  const int64_t pitch = blocks + 8;
  block_steps<MT>(L, r, sg, a, m0, steps, pitch);
  __m256 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 2 <= blocks; j += 2) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.q + 16 * j));
    __m256i evens = _mm256_and_si256(v, low2);
    __m256i odds = _mm256_and_si256(_mm256_srli_epi16(v, 4), low2);
    for (int t = 0; t < MT; ++t) {
      const int64_t m = m0 + t;
      const int8_t* xq = a.q + m * L.K + j * kBlock;
      const int8_t* xr = a.r + m * L.K + j * kBlock;
      __m256i p = _mm256_add_epi16(
          _mm256_maddubs_epi16(evens, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
          _mm256_maddubs_epi16(odds, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32))));
      __m256i pr = _mm256_add_epi16(
          _mm256_maddubs_epi16(evens, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr))),
          _mm256_maddubs_epi16(odds, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + 32))));
      __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pr, ones)), step,
                                 _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)));
      __m256 c = _mm256_permutevar8x32_ps(_mm256_loadu_ps(steps + t * pitch + j), pair_steps);
      acc[t] = _mm256_fmadd_ps(f, c, acc[t]);
    }
  }
  if (j < blocks) {  // a last unpaired block feeds lanes 0-3
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.q + 16 * j));
    __m128i evens = _mm_and_si128(v, low);
    __m128i odds = _mm_and_si128(_mm_srli_epi16(v, 4), low);
    for (int t = 0; t < MT; ++t) {
      const int64_t m = m0 + t;
      const int8_t* xq = a.q + m * L.K + j * kBlock;
      const int8_t* xr = a.r + m * L.K + j * kBlock;
      __m128i p = _mm_add_epi16(_mm_maddubs_epi16(evens, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq))),
                                _mm_maddubs_epi16(odds, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16))));
      __m128i pr = _mm_add_epi16(_mm_maddubs_epi16(evens, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr))),
                                 _mm_maddubs_epi16(odds, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + 16))));
      __m128 f = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(pr, _mm_set1_epi16(1))), _mm_set1_ps(kSecondDigitStep),
                              _mm_cvtepi32_ps(_mm_madd_epi16(p, _mm_set1_epi16(1))));
      __m128 c = _mm_set1_ps(steps[t * pitch + j]);
      __m128 lanes = _mm_fmadd_ps(f, c, _mm256_castps256_ps128(acc[t]));
      acc[t] = _mm256_insertf128_ps(acc[t], lanes, 0);
    }
  }
  for (int t = 0; t < MT; ++t) out_lanes[t] = reduce8_avx2(acc[t]);
}

template <int MT>
MLXD_AVX2 void tile8(const Layout& L, const Row& r, const float* sg, const Activations& a, int64_t m0,
                     float* steps, float* out_lanes) {
  const int64_t blocks = a.blocks;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 step = _mm256_set1_ps(kSecondDigitStep);
  const int64_t pitch = blocks + 8;
  block_steps<MT>(L, r, sg, a, m0, steps, pitch);
  __m256 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t j = 0; j < blocks; ++j) {
    __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.q + 32 * j)), flip);
    __m256i magnitude = _mm256_abs_epi8(v);
    for (int t = 0; t < MT; ++t) {
      const int64_t m = m0 + t;
      __m256i x = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + m * L.K + 32 * j)), v);
      __m256i xr = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.r + m * L.K + 32 * j)), v);
      __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xr), ones)), step,
                                 _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones)));
      acc[t] = _mm256_fmadd_ps(f, _mm256_broadcast_ss(steps + t * pitch + j), acc[t]);
    }
  }
  for (int t = 0; t < MT; ++t) out_lanes[t] = reduce8_avx2(acc[t]);
}

template <int Bits, int MT>
MLXD_AVX2 inline void tile(const Layout& L, const Row& r, const float* sg, const Activations& a, int64_t m0,
                           float* steps, float* sums) {
  if constexpr (Bits == 4) {
    tile4<MT>(L, r, sg, a, m0, steps, sums);
  } else {
    tile8<MT>(L, r, sg, a, m0, steps, sums);
  }
}

template <int Bits>
MLXD_AVX2 void rows_avx2(const Layout& L, const uint8_t* w, const void* s, const void* b, const Activations& a,
                         int64_t M, float* out, int64_t n0, int64_t n1) {
  thread_local std::vector<float> buffer;  // group scale per block, then the tile's block steps
  const int64_t pitch = a.blocks + 8;
  if (static_cast<int64_t>(buffer.size()) < 5 * pitch) buffer.resize(5 * pitch);
  float* scales = buffer.data();
  float* steps = buffer.data() + pitch;
  float sums[4];
  for (int64_t n = n0; n < n1; ++n) {
    Row r = L.row(w, s, b, n);
    if (L.group_shift != 5) block_scales(L, r, a.blocks, scales);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      int64_t count = std::min<int64_t>(4, M - m0);
      switch (count) {
        case 1: tile<Bits, 1>(L, r, scales, a, m0, steps, sums); break;
        case 2: tile<Bits, 2>(L, r, scales, a, m0, steps, sums); break;
        case 3: tile<Bits, 3>(L, r, scales, a, m0, steps, sums); break;
        default: tile<Bits, 4>(L, r, scales, a, m0, steps, sums); break;
      }
      for (int64_t t = 0; t < count; ++t) {
        int64_t m = m0 + t;
        out[m * L.N + n] = sums[t] + bias_term_avx2(L, r, a.sums + m * a.groups, a.groups);
      }
    }
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
  thread_local std::vector<int8_t> q, r;
  thread_local std::vector<float> scale, block_sums, sums;
  q.resize(M * L.K);
  r.resize(M * L.K);
  scale.resize(M * blocks);
  block_sums.resize(M * blocks);
  sums.resize(M * groups);
  const bool avx2 = use_avx2();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < blocks; ++j) {
      const float* src = x + m * L.K + kBlock * j;
      int8_t* row_q = q.data() + m * L.K;
      int8_t* row_r = r.data() + m * L.K;
#if defined(__x86_64__)
      if (avx2) {
        quantize_block_avx2(src, j, blocks, L.bits, row_q, row_r, &scale[m * blocks + j], &block_sums[m * blocks + j]);
        continue;
      }
#endif
      quantize_block_scalar(src, j, blocks, L.bits, row_q, row_r, &scale[m * blocks + j], &block_sums[m * blocks + j]);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* part = &block_sums[m * blocks + g * blocks_per_group];
      float total = part[0];
      for (int i = 1; i < blocks_per_group; ++i) total += part[i];
      sums[m * groups + g] = total;
    }
  }
  Activations a{q.data(), r.data(), scale.data(), sums.data(), blocks, groups};
  // Items of a few rows each, so both cores share even small projections.
  const int64_t rows_per_item = std::max<int64_t>(1, std::min<int64_t>(16, L.N / (8 * kernel_threads())));
  const int64_t items = (L.N + rows_per_item - 1) / rows_per_item;
  parallel_for(items, static_cast<double>(L.N) * L.K * std::max<int64_t>(M, 2) / 4, [&](int64_t item) {
    int64_t n0 = item * rows_per_item, n1 = std::min(L.N, n0 + rows_per_item);
#if defined(__x86_64__)
    if (avx2) {
      if (L.bits == 4) {
        rows_avx2<4>(L, w, scales, biases, a, M, out, n0, n1);
      } else {
        rows_avx2<8>(L, w, scales, biases, a, M, out, n0, n1);
      }
      return;
    }
#endif
    rows_scalar(L, w, scales, biases, a, M, out, n0, n1);
  });
}

}  // namespace mlxd
