// Python module worker._cpu_kernels: MLX ops that MLX's own CPU build runs slowly.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/variant.h>

#include "attention.h"
#include "logsumexp.h"
#include "parallel.h"
#include "swiglu.h"

namespace nb = nanobind;

NB_MODULE(_cpu_kernels, m) {
  m.doc() = "mlxd CPU kernels: attention, SwiGLU and logsumexp with a vectorized exp, on every core";
  m.def(
      "attention",
      &mlxd::attention,
      nb::arg("q"),
      nb::arg("k"),
      nb::arg("v"),
      nb::kw_only(),
      nb::arg("scale"),
      nb::arg("causal") = false,
      nb::arg("mask") = nb::none(),
      nb::arg("stream") = nb::none());
  m.def("swiglu", &mlxd::swiglu, nb::arg("gate"), nb::arg("up"), nb::kw_only(), nb::arg("stream") = nb::none());
  m.def(
      "logsumexp_last",
      &mlxd::logsumexp_last,
      nb::arg("x"),
      nb::kw_only(),
      nb::arg("keepdims") = false,
      nb::arg("stream") = nb::none());
  m.def("threads", &mlxd::kernel_threads);
}
