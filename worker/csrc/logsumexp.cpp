#include "logsumexp.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "cpu_primitive.h"
#include "parallel.h"
#include "vec.h"

namespace mlxd {

using namespace mlx::core;

namespace {

// One row: the max, then the sum of exp(x - max) in eight lanes added in a fixed order.
float row_logsumexp(const float* x, int64_t n) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m = neg_inf;
  bool nan = false;
  int64_t i = 0;
  if (n >= 8) {
    v8f vm = load8(x);
    v8i unordered = vm != vm;
    for (i = 8; i + 8 <= n; i += 8) {
      v8f v = load8(x + i);
      vm = v > vm ? v : vm;
      unordered |= v != v;
    }
    m = hmax(vm);
    for (int lane = 0; lane < 8; ++lane) nan |= unordered[lane] != 0;
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= std::isnan(x[i]);
  }
  if (nan) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (std::isinf(m)) {
    return m;  // all -inf: log(0) = -inf; any +inf: +inf
  }
  v8f acc = splat(0.0f);
  const v8f vmax = splat(m);
  for (i = 0; i + 8 <= n; i += 8) acc += exp8(load8(x + i) - vmax);
  float sum = hsum(acc);
  for (; i < n; ++i) sum += std::exp(x[i] - m);
  return m + std::log(sum);
}

class LogSumExpLast : public CpuPrimitive {
 public:
  explicit LogSumExpLast(Stream stream) : CpuPrimitive(stream, "MlxdLogSumExpLast") {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array& x = inputs[0];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int64_t n = x.shape(-1);
    const int64_t rows = n > 0 ? x.size() / n : 0;
    encoder.dispatch([src = x.data<float>(), dst = out.data<float>(), rows, n]() {
      parallel_for(rows, 4.0 * rows * n, [&](int64_t r) { dst[r] = row_logsumexp(src + r * n, n); });
    });
  }



};

}  // namespace

array logsumexp_last(const array& x, bool keepdims, StreamOrDevice s) {
  if (x.dtype() != float32 || x.ndim() < 1 || x.shape(-1) < 1) {
    throw std::invalid_argument("logsumexp_last: x must be a float32 array with a non-empty last axis");
  }
  Stream stream = to_stream(s);
  Shape shape = x.shape();
  if (keepdims) {
    shape.back() = 1;
  } else {
    shape.pop_back();
  }
  return array(shape, float32, std::make_shared<LogSumExpLast>(stream), {contiguous(x, false, stream)});
}

}  // namespace mlxd
