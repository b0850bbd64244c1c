// How an MLX affine-quantized (N, K) matrix lies in memory, shared by the kernels that
// dequantize it (prefill, gathers) and the one that multiplies it in place (decode).
#pragma once

#include <cstdint>
#include <cstring>

namespace mlxd {

// IEEE half to float, exact (the scalar path's F16C).
inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: renormalise
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mantissa & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// What one weight row needs: its packed bytes and its group scales/biases.
struct Row {
  const uint8_t* q;
  const void* scales;
  const void* biases;
};

// w[n, k] = scales[n, k >> group_shift] * q[n, k] + biases[...], q packed little-endian:
// 4-bit values two to a byte (value 2i in the low nibble of byte i), 8-bit one a byte,
// 5-bit as one bit stream (value i in bits 5i..5i+4), so a block of 32 is 20 bytes.
struct Layout {
  int64_t N, K;
  int64_t row_bytes;   // packed bytes per weight row
  int64_t row_groups;  // groups per weight row
  int group_shift;     // log2(group size)
  int bits;
  bool half_scales;

  Row row(const uint8_t* w, const void* s, const void* b, int64_t n) const {
    int64_t scale_bytes = half_scales ? 2 : 4;
    return {w + n * row_bytes, static_cast<const char*>(s) + n * row_groups * scale_bytes,
            static_cast<const char*>(b) + n * row_groups * scale_bytes};
  }

  float scale_at(const void* p, int64_t g) const {
    return half_scales ? half_to_float(static_cast<const uint16_t*>(p)[g]) : static_cast<const float*>(p)[g];
  }
};

// Value i of a 5-bit row: its field starts at bit 5i; it crosses into the next byte
// only when it starts past bit 3 of its byte (never for the row's last value).
inline uint32_t value5(const uint8_t* q, int64_t i) {
  int64_t bit = 5 * i;
  uint32_t word = q[bit >> 3];
  if ((bit & 7) > 3) word |= static_cast<uint32_t>(q[(bit >> 3) + 1]) << 8;
  return (word >> (bit & 7)) & 0x1F;
}

// Value i of a row of any served width, unsigned as stored.
inline uint32_t value_at(const uint8_t* q, int64_t i, int bits) {
  if (bits == 4) return (q[i >> 1] >> ((i & 1) * 4)) & 0xF;
  if (bits == 5) return value5(q, i);
  return q[i];
}

}  // namespace mlxd
