// Python module worker._cpu_kernels: MLX ops that MLX's own CPU build runs slowly.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>

#include "attention.h"
#include "gelu.h"
#include "logsumexp.h"
#include "parallel.h"
#include "norm_rope.h"
#include "quantized.h"
#include "swiglu.h"

namespace nb = nanobind;

NB_MODULE(_cpu_kernels, m) {
  m.doc() = "mlxd CPU kernels: attention, SwiGLU and logsumexp with a vectorized exp, and 4/5/8-bit quantized matmuls, on every core";
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
  m.def("gelu", &mlxd::gelu, nb::arg("x"), nb::kw_only(), nb::arg("stream") = nb::none());
  m.def("swiglu", &mlxd::swiglu, nb::arg("gate"), nb::arg("up"), nb::kw_only(), nb::arg("stream") = nb::none());
  m.def(
      "logsumexp_last",
      &mlxd::logsumexp_last,
      nb::arg("x"),
      nb::kw_only(),
      nb::arg("keepdims") = false,
      nb::arg("stream") = nb::none());
  m.def(
      "quantized_matmul",
      &mlxd::quantized_matmul,
      nb::arg("x"),
      nb::arg("w"),
      nb::arg("scales"),
      nb::arg("biases"),
      nb::kw_only(),
      nb::arg("group_size"),
      nb::arg("bits"),
      nb::arg("stream") = nb::none());
  m.def(
      "quantized_gather",
      &mlxd::quantized_gather,
      nb::arg("w"),
      nb::arg("scales"),
      nb::arg("biases"),
      nb::arg("indices"),
      nb::kw_only(),
      nb::arg("group_size"),
      nb::arg("bits"),
      nb::arg("stream") = nb::none());
  m.def("quantized_isa", &mlxd::quantized_isa);
  m.def("quantized_panel_rows", &mlxd::quantized_panel_rows);
  m.def("quantized_panels", &mlxd::quantized_panels, nb::arg("w"), nb::arg("scales"), nb::arg("biases"), nb::kw_only(),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("panel_rows"));
  m.def("rms_norm", &mlxd::rms_norm, nb::arg("x"), nb::arg("weight").none(), nb::arg("eps"), nb::kw_only(),
        nb::arg("stream") = nb::none());
  m.def(
      "rope",
      &mlxd::rope,
      nb::arg("x"),
      nb::arg("dims"),
      nb::kw_only(),
      nb::arg("traditional"),
      nb::arg("base"),
      nb::arg("scale"),
      nb::arg("offsets"),
      nb::arg("stream") = nb::none());
  m.def("threads", &mlxd::kernel_threads);
}
