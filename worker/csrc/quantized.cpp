#include "quantized.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "parallel.h"
#include "quantized_gemv.h"
#include "quantized_layout.h"

namespace mlxd {

using namespace mlx::core;

namespace {

constexpr int kBlock = 32;           // values per inner block: the smallest group size

// ---- scalar versions: the reference, and what runs without AVX2/FMA/F16C ----------

// out[0, k1-k0) = scale * q + bias of the row's values k0..k1 (multiples of 32).
void dequant_scalar(const Layout& L, const Row& r, int64_t k0, int64_t k1, float* out) {
  for (int64_t k = k0; k < k1; k += kBlock) {
    int64_t g = k >> L.group_shift;
    float s = L.scale_at(r.scales, g), b = L.scale_at(r.biases, g);
    const uint8_t* block = r.block(k / kBlock);
    for (int j = 0; j < kBlock; ++j) {
      out[k - k0 + j] = std::fma(static_cast<float>(value_at(block, j, L.bits)), s, b);
    }
  }
}

// ---- AVX2 versions: the same arithmetic (fma per value, the same lanes), vectorised --

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) inline float scale_avx(const Layout& L, const void* p, int64_t g) {
  return L.half_scales ? _cvtsh_ss(static_cast<const uint16_t*>(p)[g]) : static_cast<const float*>(p)[g];
}

__attribute__((target("avx2,fma,f16c"))) void dequant_avx2(const Layout& L, const Row& r, int64_t k0, int64_t k1,
                                                           float* out) {
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t k = k0; k < k1; k += kBlock) {
    int64_t g = k >> L.group_shift;
    __m256 s = _mm256_set1_ps(scale_avx(L, r.scales, g));
    __m256 b = _mm256_set1_ps(scale_avx(L, r.biases, g));
    __m128i v0, v1, v2, v3;  // 8 values each, one byte per value
    const uint8_t* block = r.block(k / kBlock);
    if (L.bits == 4) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
      __m128i lo = _mm_and_si128(v, low);
      __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      __m128i first = _mm_unpacklo_epi8(lo, hi);  // values 0..15 in order
      __m128i second = _mm_unpackhi_epi8(lo, hi);
      v0 = first;
      v1 = _mm_srli_si128(first, 8);
      v2 = second;
      v3 = _mm_srli_si128(second, 8);
    } else {
      // 5-bit values are spread to a byte each first (gathers are not a hot path)
      alignas(16) uint8_t spread[kBlock];
      const uint8_t* p = block;
      if (L.bits == 5) {
        for (int j = 0; j < kBlock; ++j) spread[j] = static_cast<uint8_t>(value5(block, j));
        p = spread;
      }
      v0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      v1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
      v2 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 16));
      v3 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 24));
    }
    float* o = out + (k - k0);
    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v0)), s, b));
    _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v1)), s, b));
    _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v2)), s, b));
    _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v3)), s, b));
  }
}

#endif

struct Isa {
  void (*dequant)(const Layout&, const Row&, int64_t, int64_t, float*);
  const char* name;
};

const Isa& isa() {
  static const Isa chosen = [] {
#if defined(__x86_64__)
    if (std::string(gemv_isa()) != "scalar") return Isa{dequant_avx2, gemv_isa()};
#endif
    return Isa{dequant_scalar, "scalar"};
  }();
  return chosen;
}

// Rows per tile of a weight: 1 for a plain (N, words) matrix, T for one tiled as
// (N / T, T * words) (tile_weight).
int tile_rows_of(const array& w, const array& scales) {
  return w.shape(0) > 0 ? static_cast<int>(scales.shape(0) / w.shape(0)) : 1;
}

Layout make_layout(const array& w, const array& scales, int group_size, int bits) {
  Layout L{};
  L.tile_rows = tile_rows_of(w, scales);
  L.N = scales.shape(0);
  L.row_bytes = w.shape(1) * 4 / L.tile_rows;
  L.K = L.row_bytes * 8 / bits;
  L.row_groups = scales.shape(1);
  L.group_shift = __builtin_ctz(static_cast<unsigned>(group_size));
  L.bits = bits;
  L.half_scales = scales.dtype() == float16;
  return L;
}

void check_weights(const char* op, const array& w, const array& scales, const array& biases, int group_size,
                   int bits) {
  if (bits != 4 && bits != 5 && bits != 8) throw std::invalid_argument(std::string(op) + ": bits must be 4, 5 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw std::invalid_argument(std::string(op) + ": group_size must be 32, 64 or 128");
  }
  if (w.ndim() != 2 || w.dtype() != uint32) throw std::invalid_argument(std::string(op) + ": w must be 2-D uint32");
  if (scales.ndim() != 2 || biases.shape() != scales.shape()) {
    throw std::invalid_argument(std::string(op) + ": scales and biases must be (N, K / group_size)");
  }
  int64_t tile = w.shape(0) > 0 ? scales.shape(0) / w.shape(0) : 0;
  if ((tile != 1 && tile != 2 && tile != 4) || w.shape(0) * tile != scales.shape(0) || w.shape(1) % tile != 0) {
    throw std::invalid_argument(std::string(op) + ": w must be (N, K * bits / 32), or tiled (N / T, T * K * bits / 32)");
  }
  int64_t K = w.shape(1) / tile * 32 / bits;
  if (scales.shape(1) * group_size != K) {
    throw std::invalid_argument(std::string(op) + ": scales and biases must be (N, K / group_size)");
  }
  if ((scales.dtype() != float32 && scales.dtype() != float16) || biases.dtype() != scales.dtype()) {
    throw std::invalid_argument(std::string(op) + ": scales and biases must both be float32 or both float16");
  }
}

class QuantizedMatmul : public Primitive {
 public:
  QuantizedMatmul(Stream stream, int group_size, int bits) : Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    array& out = outputs[0];
    out.set_data(allocator::malloc(out.nbytes()));
    auto& encoder = cpu::get_command_encoder(stream());
    for (const array& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    Layout L = make_layout(w, scales, group_size_, bits_);
    int64_t M = x.size() / L.K;
    encoder.dispatch([L, M, xp = x.data<float>(), wp = w.data<uint8_t>(), sp = scales.data<void>(),
                      bp = biases.data<void>(), op = out.data<float>()]() {
      if (M > 0) gemv(L, wp, sp, bp, xp, M, op);
    });
  }

  void eval_gpu(const std::vector<array>&, std::vector<array>&) override {
    throw std::runtime_error("mlxd quantized_matmul runs on the CPU stream only");
  }

  const char* name() const override {
    return "MlxdQuantizedMatmul";
  }

  bool is_equivalent(const Primitive& other) const override {
    const auto& o = static_cast<const QuantizedMatmul&>(other);
    return o.group_size_ == group_size_ && o.bits_ == bits_;
  }

 private:
  int group_size_, bits_;
};

class QuantizedGather : public Primitive {
 public:
  QuantizedGather(Stream stream, int group_size, int bits) : Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array &w = inputs[0], &scales = inputs[1], &biases = inputs[2], &indices = inputs[3];
    array& out = outputs[0];
    out.set_data(allocator::malloc(out.nbytes()));
    auto& encoder = cpu::get_command_encoder(stream());
    for (const array& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    Layout L = make_layout(w, scales, group_size_, bits_);
    encoder.dispatch([L, wp = w.data<uint8_t>(), sp = scales.data<void>(), bp = biases.data<void>(),
                      ip = indices.data<int32_t>(), count = static_cast<int64_t>(indices.size()),
                      op = out.data<float>()]() {
      const Isa& f = isa();
      parallel_for(count, static_cast<double>(count) * L.K * 4, [&](int64_t i) {
        int64_t n = ip[i];
        float* dest = op + i * L.K;
        if (n < 0 || n >= L.N) {
          std::fill(dest, dest + L.K, 0.0f);  // out of range: zeros, never a read past the matrix
          return;
        }
        f.dequant(L, L.row(wp, sp, bp, n), 0, L.K, dest);
      });
    });
  }

  void eval_gpu(const std::vector<array>&, std::vector<array>&) override {
    throw std::runtime_error("mlxd quantized_gather runs on the CPU stream only");
  }

  const char* name() const override {
    return "MlxdQuantizedGather";
  }

  bool is_equivalent(const Primitive& other) const override {
    const auto& o = static_cast<const QuantizedGather&>(other);
    return o.group_size_ == group_size_ && o.bits_ == bits_;
  }

 private:
  int group_size_, bits_;
};

// Weights are evaluated and row-contiguous when a model calls this: a Contiguous node
// per weight, scale and bias array would cost a dispatch each (~6 us), 3 per matmul.
array contiguous_input(const array& a, Stream stream) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return contiguous(a, false, stream);
}

}  // namespace

array quantized_matmul(const array& x, const array& w, const array& scales, const array& biases, int group_size,
                       int bits, StreamOrDevice s) {
  check_weights("quantized_matmul", w, scales, biases, group_size, bits);
  int64_t K = scales.shape(1) * group_size;
  if (x.dtype() != float32 || x.ndim() < 1 || x.shape(-1) != K) {
    throw std::invalid_argument("quantized_matmul: x must be float32 with a last axis of K = " + std::to_string(K));
  }
  Shape shape = x.shape();
  shape.back() = scales.shape(0);
  Stream stream = to_stream(s);
  return array(std::move(shape), float32, std::make_shared<QuantizedMatmul>(stream, group_size, bits),
               {contiguous_input(x, stream), contiguous_input(w, stream), contiguous_input(scales, stream),
                contiguous_input(biases, stream)});
}

array quantized_gather(const array& w, const array& scales, const array& biases, const array& indices,
                       int group_size, int bits, StreamOrDevice s) {
  check_weights("quantized_gather", w, scales, biases, group_size, bits);
  if (!issubdtype(indices.dtype(), integer)) throw std::invalid_argument("quantized_gather: indices must be integers");
  Shape shape = indices.shape();
  shape.push_back(static_cast<int>(scales.shape(1) * group_size));
  Stream stream = to_stream(s);
  return array(std::move(shape), float32, std::make_shared<QuantizedGather>(stream, group_size, bits),
               {contiguous_input(w, stream), contiguous_input(scales, stream), contiguous_input(biases, stream),
                contiguous(astype(indices, int32, stream), false, stream)});
}

std::string quantized_isa() {
  return isa().name;
}

int quantized_tile_rows() {
  return gemv_tile_rows();
}

}  // namespace mlxd
