#include "parallel.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace mlxd {

namespace {

// Below this many multiply-adds handing items to the pool (~2 us when its threads are
// awake, ~10 us when they sleep) is not repaid.
constexpr double kMinParallelWork = 3.0e4;
// How long an idle helper spins before it sleeps. A decode step calls a kernel every few
// tens of microseconds, so helpers stay awake through a step; between steps (or while
// BLAS runs its own threads on these cores) they sleep and cost nothing.
constexpr auto kSpin = std::chrono::microseconds(60);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A fixed set of helper threads, started on first use and kept for the process.
// Invariants: one job at a time (`submit_` is held by the caller for the whole job);
// `generation_` changes exactly once per job; `state_` is the number of helpers inside
// the job plus kClosed once the caller has run out of items: a helper enters only an
// open job, and the caller returns once the job is closed and empty, so `fn` outlives
// every use of it. A helper that wakes late (asleep, or descheduled on a busy machine)
// finds the job closed and is never waited for: the caller runs the items itself.
class Pool {
 public:
  explicit Pool(int helpers) {
    for (int t = 0; t < helpers; ++t) threads_.emplace_back([this] { run(); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // False if another job holds the pool (a kernel called from two streams, or from
  // inside a job): the caller then runs its items itself.
  bool run_job(int64_t n, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    if (!submit.owns_lock()) return false;
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    state_.store(0, std::memory_order_release);  // open, nobody inside
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    drain();
    state_.fetch_or(kClosed, std::memory_order_acq_rel);
    for (int spins = 1; (state_.load(std::memory_order_acquire) & ~kClosed) != 0; ++spins) {
      if (spins % 256 == 0) {
        std::this_thread::yield();
      } else {
        cpu_relax();
      }
    }
    return true;
  }

 private:
  void drain() {
    for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
         i = next_.fetch_add(1, std::memory_order_relaxed)) {
      (*fn_)(i);
    }
  }

  void run() {
    uint64_t seen = 0;  // the constructor's generation: a job submitted before this thread ran is still seen
    for (;;) {
      auto deadline = std::chrono::steady_clock::now() + kSpin;
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        cpu_relax();
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      uint64_t state = state_.load(std::memory_order_acquire);
      while ((state & kClosed) == 0) {
        if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) {
          drain();
          state_.fetch_sub(1, std::memory_order_release);
          break;
        }
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex submit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0};
  static constexpr uint64_t kClosed = uint64_t{1} << 63;
  std::atomic<uint64_t> state_{kClosed};
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  // Leaked on purpose: joining threads from a static destructor at interpreter exit
  // can deadlock with the runtime's own teardown.
  static Pool* instance = new Pool(kernel_threads() - 1);
  return *instance;
}

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
  if (kernel_threads() <= 1 || n <= 1 || work < kMinParallelWork || !pool().run_job(n, fn)) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace mlxd
