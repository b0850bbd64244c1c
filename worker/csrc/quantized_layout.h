// How an MLX affine-quantized (N, K) matrix lies in memory, in MLX's own layout or as
// panels (the kernels' layout), shared by the matmul, the gather and the repacker.
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

// Value i (0..31) of a 32-value block in MLX's packing, unsigned as stored: 4-bit two to
// a byte (value 2e in the low nibble of byte e), 8-bit one a byte, 5-bit as one bit
// stream (value i in bits 5i..5i+4, crossing into the next byte only when it starts past
// bit 3 of its byte, which the block's last value never does).
inline uint32_t mlx_value(const uint8_t* block, int i, int bits) {
  if (bits == 4) return (block[i >> 1] >> ((i & 1) * 4)) & 0xF;
  if (bits == 8) return block[i];
  int bit = 5 * i;
  uint32_t word = block[bit >> 3];
  if ((bit & 7) > 3) word |= static_cast<uint32_t>(block[(bit >> 3) + 1]) << 8;
  return (word >> (bit & 7)) & 0x1F;
}

// Panels (panel_rows R > 1, R = 16 for the AVX-512 loop, 8 for the AVX2 loops): the rows
// are taken R at a time and each 32-value block of those R rows is stored as one run of
// 4 * bits * R bytes, so the kernel reads a panel as one sequential stream and cuts its
// integers straight into the lanes it multiplies: operand p (0..15) of a block holds
// values 2p and 2p+1 of each row, row r in 16-bit lanes 2r and 2r+1 (one 32-bit lane per
// row, which a 16-bit multiply-add with a broadcast pair of activations fills).
// The run is read as 16-bit words w = 2r + h (value 2p + h of row r):
//   8-bit: 8 vectors of 2R words; operand 2i is the low byte of vector i, 2i+1 its high byte.
//   4-bit: 4 vectors; operand 4i + e is nibble e (bits 4e..4e+3) of vector i.
//   5-bit: the low four bits as 4-bit, then a fifth vector whose bit p is bit 4 of operand p.
// Scales and biases of a panel are (groups, R): group g of its R rows side by side.
struct Layout {
  int64_t N, K;
  int64_t row_groups;  // groups per weight row
  int group_shift;     // log2(group size)
  int bits;
  bool half_scales;
  int panel_rows = 1;   // 1: MLX's (N, K * bits / 32) matrix; else rows per panel

  int64_t blocks() const {
    return K / 32;
  }

  // Bytes of one 32-value block of one row.
  int64_t block_bytes() const {
    return 4 * bits;
  }

  // Where panel `panel`'s block j starts.
  const uint8_t* panel_block(const uint8_t* w, int64_t panel, int64_t j) const {
    return w + (panel * blocks() + j) * block_bytes() * panel_rows;
  }

  // Index of (row n, group g) in the scales and biases arrays.
  int64_t group_index(int64_t n, int64_t g) const {
    if (panel_rows == 1) return n * row_groups + g;
    return ((n / panel_rows) * row_groups + g) * panel_rows + n % panel_rows;
  }

  float scale_at(const void* p, int64_t index) const {
    return half_scales ? half_to_float(static_cast<const uint16_t*>(p)[index]) : static_cast<const float*>(p)[index];
  }

  // q[n, k], unsigned as stored, in either layout.
  uint32_t value(const uint8_t* w, int64_t n, int64_t k) const {
    const int64_t j = k / 32;
    const int i = static_cast<int>(k % 32);
    if (panel_rows == 1) return mlx_value(w + n * blocks() * block_bytes() + j * block_bytes(), i, bits);
    const uint8_t* run = panel_block(w, n / panel_rows, j);
    const int64_t word = 2 * (n % panel_rows) + (i & 1);
    const int p = i >> 1;
    const int64_t vector_bytes = 4 * panel_rows;  // 2R words
    auto word_of = [&](int vector) {
      uint16_t v;
      std::memcpy(&v, run + vector * vector_bytes + 2 * word, sizeof(v));
      return static_cast<uint32_t>(v);
    };
    if (bits == 8) return (word_of(p >> 1) >> (8 * (p & 1))) & 0xFF;
    uint32_t low = (word_of(p >> 2) >> (4 * (p & 3))) & 0xF;
    if (bits == 4) return low;
    return low | (((word_of(4) >> p) & 1) << 4);
  }
};

}  // namespace mlxd
