// What every mlxd primitive shares, written once. The kernels are AVX2 C++ for the CPU
// stream, so a GPU evaluation is refused; each primitive writes one fresh output, and its
// inputs and output are registered with the stream's CPU encoder so MLX keeps them alive
// until the dispatched kernel has run.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mlxd {

class CpuPrimitive : public mlx::core::Primitive {
 public:
  CpuPrimitive(mlx::core::Stream stream, const char* name) : Primitive(stream), name_(name) {}

  void eval_gpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw std::runtime_error(std::string(name_) + " runs on the CPU stream only");
  }

  const char* name() const override {
    return name_;
  }

  // Without parameters, one primitive equals any other of its type (MLX compares the
  // types first); a primitive with parameters compares them in its own override.
  bool is_equivalent(const mlx::core::Primitive&) const override {
    return true;
  }

 protected:
  // Allocates `out`, registers `inputs` and `out` with the stream's encoder, and returns
  // the encoder the kernel is dispatched on.
  mlx::core::cpu::CommandEncoder& prepare(const std::vector<mlx::core::array>& inputs, mlx::core::array& out) {
    out.set_data(mlx::core::allocator::malloc(out.nbytes()));
    auto& encoder = mlx::core::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    return encoder;
  }

 private:
  const char* name_;
};

}  // namespace mlxd
