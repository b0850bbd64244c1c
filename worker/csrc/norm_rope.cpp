#include "norm_rope.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "cpu_primitive.h"
#include "parallel.h"
#include "vec.h"

namespace mlxd {

using namespace mlx::core;

namespace {

void rms_rows(const float* x, const float* w, float* out, int64_t rows, int64_t D, float eps) {
  parallel_for(rows, static_cast<double>(rows) * D * 2, [&](int64_t r) {
    const float* row = x + r * D;
    float* dest = out + r * D;
    v8f acc = splat(0.0f);
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
      v8f v = load8(row + i);
      acc += v * v;
    }
    float sum = hsum(acc);
    for (; i < D; ++i) sum += row[i] * row[i];
    float inverse = 1.0f / std::sqrt(sum / static_cast<float>(D) + eps);
    const v8f scale = splat(inverse);
    i = 0;
    for (; i + 8 <= D; i += 8) {
      v8f v = load8(row + i) * scale;
      store8(dest + i, w ? v * load8(w + i) : v);
    }
    for (; i < D; ++i) dest[i] = w ? row[i] * inverse * w[i] : row[i] * inverse;
  });
}

class RMSNorm : public CpuPrimitive {
 public:
  RMSNorm(Stream stream, float eps, bool has_weight) : CpuPrimitive(stream, "MlxdRMSNorm"), eps_(eps), has_weight_(has_weight) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array& x = inputs[0];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int64_t D = x.shape(-1);
    encoder.dispatch([xp = x.data<float>(), wp = has_weight_ ? inputs[1].data<float>() : nullptr,
                      op = out.data<float>(), rows = static_cast<int64_t>(x.size()) / D, D, eps = eps_]() {
      rms_rows(xp, wp, op, rows, D, eps);
    });
  }



  bool is_equivalent(const Primitive& other) const override {
    const auto& o = static_cast<const RMSNorm&>(other);
    return o.eps_ == eps_ && o.has_weight_ == has_weight_;
  }

 private:
  float eps_;
  bool has_weight_;
};

struct RopeJob {
  const float* x;
  const int32_t* offsets;
  int64_t num_offsets;
  float* out;
  int64_t B, H, T, D;  // H: every axis between the first and T, flattened
  int dims;
  bool traditional;
  float base, scale;
};

void rope_rows(const RopeJob& j) {
  const int half = j.dims / 2;
  std::vector<float> inverse_frequency(half);
  for (int i = 0; i < half; ++i) {
    inverse_frequency[i] = static_cast<float>(std::pow(static_cast<double>(j.base), -2.0 * i / j.dims));
  }
  // one (b, t) position's cos/sin serve all its heads
  parallel_for(j.B * j.T, static_cast<double>(j.B) * j.T * j.H * j.D * 4, [&](int64_t item) {
    const int64_t b = item / j.T, t = item % j.T;
    const int64_t start = j.offsets[j.num_offsets == 1 ? 0 : b];
    const float position = static_cast<float>(start + t) * j.scale;
    std::vector<float> cosines(half), sines(half);
    for (int i = 0; i < half; ++i) {
      float theta = position * inverse_frequency[i];
      cosines[i] = std::cos(theta);
      sines[i] = std::sin(theta);
    }
    for (int64_t h = 0; h < j.H; ++h) {
      const int64_t row = (b * j.H + h) * j.T + t;
      const float* src = j.x + row * j.D;
      float* dest = j.out + row * j.D;
      for (int i = 0; i < half; ++i) {
        const int a = j.traditional ? 2 * i : i;
        const int c = j.traditional ? 2 * i + 1 : i + half;
        const float x1 = src[a], x2 = src[c];
        dest[a] = x1 * cosines[i] - x2 * sines[i];
        dest[c] = x1 * sines[i] + x2 * cosines[i];
      }
      for (int64_t d = j.dims; d < j.D; ++d) dest[d] = src[d];
    }
  });
}

class Rope : public CpuPrimitive {
 public:
  Rope(Stream stream, int dims, bool traditional, float base, float scale)
      : CpuPrimitive(stream, "MlxdRope"), dims_(dims), traditional_(traditional), base_(base), scale_(scale) {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array &x = inputs[0], &offsets = inputs[1];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    RopeJob job{};
    job.x = x.data<float>();
    job.offsets = offsets.data<int32_t>();
    job.num_offsets = static_cast<int64_t>(offsets.size());
    job.out = out.data<float>();
    job.B = x.shape(0);
    job.T = x.shape(-2);
    job.D = x.shape(-1);
    job.H = static_cast<int64_t>(x.size()) / (job.B * job.T * job.D);
    job.dims = dims_;
    job.traditional = traditional_;
    job.base = base_;
    job.scale = scale_;
    encoder.dispatch([job]() { rope_rows(job); });
  }



  bool is_equivalent(const Primitive& other) const override {
    const auto& o = static_cast<const Rope&>(other);
    return o.dims_ == dims_ && o.traditional_ == traditional_ && o.base_ == base_ && o.scale_ == scale_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
};

}  // namespace

array rms_norm(const array& x, const std::optional<array>& weight, float eps, StreamOrDevice s) {
  if (x.dtype() != float32 || x.ndim() < 1) throw std::invalid_argument("rms_norm: x must be float32");
  if (weight && (weight->dtype() != float32 || weight->ndim() != 1 || weight->shape(0) != x.shape(-1))) {
    throw std::invalid_argument("rms_norm: weight must be float32 of x's last dimension");
  }
  Stream stream = to_stream(s);
  std::vector<array> inputs = {contiguous(x, false, stream)};
  if (weight) {  // an evaluated contiguous weight needs no Contiguous node (a dispatch each)
    bool ready = weight->is_available() && weight->flags().row_contiguous;
    inputs.push_back(ready ? *weight : contiguous(*weight, false, stream));
  }
  return array(x.shape(), float32, std::make_shared<RMSNorm>(stream, eps, weight.has_value()), std::move(inputs));
}

array rope(const array& x, int dims, bool traditional, float base, float scale, const array& offsets,
           StreamOrDevice s) {
  if (x.dtype() != float32 || x.ndim() < 3) throw std::invalid_argument("rope: x must be float32, at least 3-D");
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1)) throw std::invalid_argument("rope: dims must be even, <= D");
  if (offsets.size() != 1 && (offsets.ndim() != 1 || offsets.shape(0) != x.shape(0))) {
    throw std::invalid_argument("rope: offsets must be one position or one per sequence");
  }
  Stream stream = to_stream(s);
  return array(x.shape(), float32, std::make_shared<Rope>(stream, dims, traditional, base, scale),
               {contiguous(x, false, stream), contiguous(astype(offsets, int32, stream), false, stream)});
}

}  // namespace mlxd
