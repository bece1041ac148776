// Small bodies used to poison buffers and to test the executors themselves.
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <chrono>
#endif

#include "pagedkv/macros.hpp"

namespace pagedkv::kernels {

/// dst[i] = value, over 32-bit words.
struct FillBody {
  uint32_t* dst;
  uint32_t value;
  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const { dst[i] = value; }
};

/// out[i] = start + i * step.
struct IotaBody {
  int64_t* out;
  int64_t start;
  int64_t step;
  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const { out[i] = start + i * step; }
};

/// Busy-waits `nanoseconds` of wall time: a stand-in for a model's kernel that keeps a stream
/// (and, launched over enough indices, the SMs) busy, so tests and benchmarks can check what runs
/// beside it on the GPU as the CPU backend's delays do on the host. On the device every index
/// spins (reading the global timer), side by side; on the host, where a launch's indices run one
/// after another, index 0 alone does (on the steady clock), so a launch takes about the same
/// time on both (the CPU backend runs it on the stream's worker, never inline).
struct SpinBody {
  int64_t nanoseconds;
  PAGEDKV_HOST_DEVICE void operator()([[maybe_unused]] int64_t i) const {
#if defined(__CUDA_ARCH__)
    uint64_t start = 0;
    uint64_t now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (static_cast<int64_t>(now - start) < nanoseconds);
#else
    if (i != 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(nanoseconds);
    while (std::chrono::steady_clock::now() < until) {
    }
#endif
  }
};

}  // namespace pagedkv::kernels
