#include "quantized.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "cpu_primitive.h"
#include "parallel.h"
#include "quantized_gemv.h"
#include "quantized_layout.h"

namespace mlxd {

using namespace mlx::core;

namespace {

// Row n of the matrix, values k0..k1 (multiples of 32) dequantized: scale * q + bias.
// Gathers (an embedding lookup: a row per token) are not a hot path, so one scalar loop
// reads both layouts.
void dequant_row(const Layout& L, const uint8_t* w, const void* s, const void* b, int64_t n, int64_t k0, int64_t k1,
                 float* out) {
  for (int64_t k = k0; k < k1; ++k) {
    int64_t index = L.group_index(n, k >> L.group_shift);
    out[k - k0] = std::fma(static_cast<float>(L.value(w, n, k)), L.scale_at(s, index), L.scale_at(b, index));
  }
}

// Rows per panel of a weight: 1 for MLX's (N, words) matrix, R for panels, which
// quantized_panels stores as (N / R, R * words) so that MLX's own ops refuse them.
int panel_rows_of(const array& w, const array& scales) {
  return w.shape(0) > 0 ? static_cast<int>(scales.shape(0) / w.shape(0)) : 1;
}

Layout make_layout(const array& w, const array& scales, int group_size, int bits) {
  Layout L{};
  L.panel_rows = panel_rows_of(w, scales);
  L.N = scales.shape(0);
  L.K = scales.shape(1) * group_size;
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
  int64_t panel = w.shape(0) > 0 ? scales.shape(0) / w.shape(0) : 0;
  if ((panel != 1 && panel != 8 && panel != 16) || w.shape(0) * panel != scales.shape(0) || w.shape(1) % panel != 0) {
    throw std::invalid_argument(std::string(op) + ": w must be (N, K * bits / 32), or panels (N / R, R * K * bits / 32)");
  }
  int64_t K = w.shape(1) / panel * 32 / bits;
  if (scales.shape(1) * group_size != K) {
    throw std::invalid_argument(std::string(op) + ": scales and biases must be (N, K / group_size)");
  }
  if ((scales.dtype() != float32 && scales.dtype() != float16) || biases.dtype() != scales.dtype()) {
    throw std::invalid_argument(std::string(op) + ": scales and biases must both be float32 or both float16");
  }
}

class QuantizedMatmul : public CpuPrimitive {
 public:
  QuantizedMatmul(Stream stream, int group_size, int bits) : CpuPrimitive(stream, "MlxdQuantizedMatmul"), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    Layout L = make_layout(w, scales, group_size_, bits_);
    int64_t M = x.size() / L.K;
    encoder.dispatch([L, M, xp = x.data<float>(), wp = w.data<uint8_t>(), sp = scales.data<void>(),
                      bp = biases.data<void>(), op = out.data<float>()]() {
      if (M > 0) gemv(L, wp, sp, bp, xp, M, op);
    });
  }



  bool is_equivalent(const Primitive& other) const override {
    const auto& o = static_cast<const QuantizedMatmul&>(other);
    return o.group_size_ == group_size_ && o.bits_ == bits_;
  }

 private:
  int group_size_, bits_;
};

class QuantizedGather : public CpuPrimitive {
 public:
  QuantizedGather(Stream stream, int group_size, int bits) : CpuPrimitive(stream, "MlxdQuantizedGather"), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array &w = inputs[0], &scales = inputs[1], &biases = inputs[2], &indices = inputs[3];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    Layout L = make_layout(w, scales, group_size_, bits_);
    encoder.dispatch([L, wp = w.data<uint8_t>(), sp = scales.data<void>(), bp = biases.data<void>(),
                      ip = indices.data<int32_t>(), count = static_cast<int64_t>(indices.size()),
                      op = out.data<float>()]() {
      parallel_for(count, static_cast<double>(count) * L.K * 4, [&](int64_t i) {
        int64_t n = ip[i];
        float* dest = op + i * L.K;
        if (n < 0 || n >= L.N) {
          std::fill(dest, dest + L.K, 0.0f);  // out of range: zeros, never a read past the matrix
          return;
        }
        dequant_row(L, wp, sp, bp, n, 0, L.K, dest);
      });
    });
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
  return gemv_isa();
}

std::tuple<array, array, array> quantized_panels(const array& w, const array& scales, const array& biases,
                                               int group_size, int bits, int panel_rows) {
  check_weights("quantized_panels", w, scales, biases, group_size, bits);
  if (panel_rows_of(w, scales) != 1) throw std::invalid_argument("quantized_panels: w is already in panels");
  if ((panel_rows != 8 && panel_rows != 16) || scales.shape(0) % panel_rows != 0) {
    throw std::invalid_argument("quantized_panels: panel_rows must be 8 or 16 and divide the rows");
  }
  array wc = contiguous(w), sc = contiguous(scales), bc = contiguous(biases);
  eval({wc, sc, bc});
  Layout L = make_layout(wc, sc, group_size, bits);
  std::vector<uint8_t> panel_w(wc.nbytes());
  std::vector<uint8_t> panel_s(sc.nbytes()), panel_b(bc.nbytes());
  repack_panels(L, wc.data<uint8_t>(), sc.data<void>(), bc.data<void>(), panel_rows, panel_w.data(), panel_s.data(),
                panel_b.data());
  Shape shape{static_cast<int>(w.shape(0) / panel_rows), static_cast<int>(w.shape(1) * panel_rows)};
  array out_w(reinterpret_cast<const uint32_t*>(panel_w.data()), shape, uint32);
  auto same = [](const std::vector<uint8_t>& bytes, const array& like) {
    if (like.dtype() == float16) return array(reinterpret_cast<const float16_t*>(bytes.data()), like.shape(), float16);
    return array(reinterpret_cast<const float*>(bytes.data()), like.shape(), float32);
  };
  return {out_w, same(panel_s, sc), same(panel_b, bc)};
}

int quantized_panel_rows() {
  return gemv_panel_rows();
}

}  // namespace mlxd
