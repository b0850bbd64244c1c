// Spread a loop over the cores this process may use. MLX runs each CPU op on one
// thread; attention and the gated activation are worth every core.
#pragma once

#include <cstdint>
#include <functional>

namespace mlxd {

// Threads to use: MLXD_KERNEL_THREADS, else the CPUs in this process's affinity mask.
int kernel_threads();

// Calls fn(i) once for every i in [0, n). Threads take the next item as they finish
// one, so uneven items (causal attention rows) still balance. `work` is the caller's
// estimate in multiply-adds: small jobs stay on the calling thread.
void parallel_for(int64_t n, double work, const std::function<void(int64_t)>& fn);

}  // namespace mlxd
