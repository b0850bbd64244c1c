#include "swiglu.h"

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

void swiglu_range(const float* gate, const float* up, float* out, int64_t begin, int64_t end) {
  int64_t i = begin;
  const v8f one = splat(1.0f);
  for (; i + 8 <= end; i += 8) {
    v8f g = load8(gate + i);
    store8(out + i, g * load8(up + i) / (one + exp8(-g)));
  }
  for (; i < end; ++i) {
    float g = gate[i];
    out[i] = g * up[i] / (1.0f + std::exp(-g));
  }
}

class SwiGLU : public CpuPrimitive {
 public:
  explicit SwiGLU(Stream stream) : CpuPrimitive(stream, "MlxdSwiGLU") {}

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    const array& gate = inputs[0];
    const array& up = inputs[1];
    array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int64_t n = out.size();
    encoder.dispatch([g = gate.data<float>(), u = up.data<float>(), o = out.data<float>(), n]() {
      const int64_t items = (n + kChunk - 1) / kChunk;
      parallel_for(items, 8.0 * n, [&](int64_t item) {
        int64_t begin = item * kChunk;
        swiglu_range(g, u, o, begin, std::min(n, begin + kChunk));
      });
    });
  }



};

}  // namespace

array swiglu(const array& gate, const array& up, StreamOrDevice s) {
  if (gate.dtype() != float32 || up.dtype() != float32 || gate.shape() != up.shape()) {
    throw std::invalid_argument("swiglu: gate and up must be float32 arrays of one shape");
  }
  Stream stream = to_stream(s);
  return array(
      gate.shape(),
      float32,
      std::make_shared<SwiGLU>(stream),
      {contiguous(gate, false, stream), contiguous(up, false, stream)});
}

}  // namespace mlxd
