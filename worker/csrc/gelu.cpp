#include "gelu.h"

#include <algorithm>
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

constexpr int64_t kChunk = 4096;  // floats per work item

inline v8f gelu8(v8f x) {
  const v8f one = splat(1.0f), half = splat(0.5f);
  v8f z = x * splat(0.70710678118654752f);
  v8f sign = z < splat(0.0f) ? -one : one;
  v8f a = z * sign;  // |z|
  v8f t = one / (one + splat(0.3275911f) * a);
  v8f poly = ((((splat(1.061405429f) * t + splat(-1.453152027f)) * t + splat(1.421413741f)) * t +
               splat(-0.284496736f)) * t + splat(0.254829592f)) * t;
  v8f erf = sign * (one - poly * exp8(-a * a));
  return half * x * (one + erf);
}

void gelu_range(const float* x, float* out, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) store8(out + i, gelu8(load8(x + i)));
  if (i < end) {  // the tail through the same vector code
    float in[8] = {}, result[8];
    std::copy(x + i, x + end, in);
    store8(result, gelu8(load8(in)));
    std::copy(result, result + (end - i), out + i);
  }
}

class Gelu : public CpuPrimitive {
 public:
  explicit Gelu(Stream stream) : CpuPrimitive(stream, "MlxdGelu") {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array& x = inputs[0];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int64_t n = out.size();
    encoder.dispatch([xp = x.data<float>(), o = out.data<float>(), n]() {
      const int64_t items = (n + kChunk - 1) / kChunk;
      parallel_for(items, 12.0 * n, [&](int64_t item) {
        int64_t begin = item * kChunk;
        gelu_range(xp, o, begin, std::min(n, begin + kChunk));
      });
    });
  }



};

}  // namespace

array gelu(const array& x, StreamOrDevice s) {
  if (x.dtype() != float32) throw std::invalid_argument("gelu: x must be float32");
  Stream stream = to_stream(s);
  return array(x.shape(), float32, std::make_shared<Gelu>(stream), {contiguous(x, false, stream)});
}

}  // namespace mlxd
