#include "parallel.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

namespace mlxd {

namespace {
// Below this many multiply-adds a thread start (~20 us) is not repaid.
constexpr double kMinParallelWork = 2.0e5;
}  // namespace

int kernel_threads() {
  static const int threads = [] {
    if (const char* env = std::getenv("MLXD_KERNEL_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      return std::max(1, CPU_COUNT(&set));
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return threads;
}

void parallel_for(int64_t n, double work, const std::function<void(int64_t)>& fn) {
  int threads = static_cast<int>(std::min<int64_t>(kernel_threads(), n));
  if (threads <= 1 || work < kMinParallelWork) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto drain = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) helpers.emplace_back(drain);
  drain();
  for (auto& h : helpers) h.join();
}

}  // namespace mlxd
