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

// What one weight row needs: its packed bytes (block j at q + j * stride) and its group
// scales/biases.
struct Row {
  const uint8_t* q;
  int64_t stride;  // bytes from one 32-value block of the row to its next
  const void* scales;
  const void* biases;

  const uint8_t* block(int64_t j) const {
    return q + j * stride;
  }
};

// w[n, k] = scales[n, k >> group_shift] * q[n, k] + biases[...], q packed little-endian:
// 4-bit values two to a byte (value 2i in the low nibble of byte i), 8-bit one a byte,
// 5-bit as one bit stream (value i in bits 5i..5i+4), so a block of 32 is 20 bytes.
//
// Tiled (tile_rows > 1): the rows are taken tile_rows at a time and their blocks
// interleaved, block j of rows 4t..4t+3 side by side, so a kernel that reads a tile's
// rows together reads one sequential stream. (Interleaved row streams, as a plain
// (N, K) matrix gives a 4-row tile, halve what this CPU's prefetchers deliver: 23 GB/s
// from one stream, 10.5 GB/s from four streams 896 bytes apart.) Scales and biases stay
// (N, groups), one row after another.
struct Layout {
  int64_t N, K;
  int64_t row_bytes;   // packed bytes per weight row
  int64_t row_groups;  // groups per weight row
  int group_shift;     // log2(group size)
  int bits;
  bool half_scales;
  int tile_rows = 1;   // rows whose blocks are interleaved (1: a plain (N, K) matrix)

  int64_t block_bytes() const {
    return 4 * bits;  // 32 values
  }

  Row row(const uint8_t* w, const void* s, const void* b, int64_t n) const {
    int64_t scale_bytes = half_scales ? 2 : 4;
    const uint8_t* q = w + (n / tile_rows) * tile_rows * row_bytes + (n % tile_rows) * block_bytes();
    return {q, tile_rows * block_bytes(), static_cast<const char*>(s) + n * row_groups * scale_bytes,
            static_cast<const char*>(b) + n * row_groups * scale_bytes};
  }

  float scale_at(const void* p, int64_t g) const {
    return half_scales ? half_to_float(static_cast<const uint16_t*>(p)[g]) : static_cast<const float*>(p)[g];
  }
};

// Value i of a 5-bit block: its field starts at bit 5i; it crosses into the next byte
// only when it starts past bit 3 of its byte (never for the block's last value).
inline uint32_t value5(const uint8_t* q, int64_t i) {
  int64_t bit = 5 * i;
  uint32_t word = q[bit >> 3];
  if ((bit & 7) > 3) word |= static_cast<uint32_t>(q[(bit >> 3) + 1]) << 8;
  return (word >> (bit & 7)) & 0x1F;
}

// Value i (0..31) of a block of any served width, unsigned as stored.
inline uint32_t value_at(const uint8_t* q, int64_t i, int bits) {
  if (bits == 4) return (q[i >> 1] >> ((i & 1) * 4)) & 0xF;
  if (bits == 5) return value5(q, i);
  return q[i];
}

}  // namespace mlxd
