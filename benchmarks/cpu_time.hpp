// Thread CPU time for the benchmarks that time parts of a step by hand: the build machine is
// shared, so wall time would count other jobs.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdint>

namespace pagedkv {
namespace bench {

/// Thread CPU time in ns.
inline int64_t cpu_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

/// What an empty cpu_now_ns() interval measures (the clock is a syscall here, ~0.5 us), so that
/// short timed parts can subtract it. Minimum of many tries.
inline int64_t cpu_clock_overhead_ns() {
  static const int64_t overhead = [] {
    int64_t best = INT64_MAX;
    for (int i = 0; i < 2000; ++i) {
      const int64_t t0 = cpu_now_ns();
      best = std::min(best, cpu_now_ns() - t0);
    }
    return best;
  }();
  return overhead;
}

/// A timed interval less the clock's own cost, never negative.
inline int64_t cpu_interval_ns(int64_t t0, int64_t t1) {
  return std::max<int64_t>(t1 - t0 - cpu_clock_overhead_ns(), 0);
}

}  // namespace bench
}  // namespace pagedkv
