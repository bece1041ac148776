// Division by a divisor fixed on the host, with a precomputed multiplier: one 64 x 64 -> 128-bit
// high multiply, an add and two shifts instead of a 64-bit division (which nvcc compiles to a
// call of a ~70-instruction routine). The method is Granlund and Montgomery, "Division by
// invariant integers using multiplication" (PLDI 1994), figure 4.1 with N = 64, the one behind
// FlashInfer's uint_fastdiv and CUTLASS's FastDivmod. Exact for every dividend in [0, 2^64) and
// every divisor in [1, 2^63]; host and device give the same quotients (tests/kernels).
#pragma once

#include <cstdint>

#include "pagedkv/macros.hpp"

namespace pagedkv::kernels {

namespace detail {

__extension__ typedef unsigned __int128 Uint128;  // GCC/Clang/nvcc host extension

/// The high 64 bits of a * b.
PAGEDKV_HOST_DEVICE uint64_t mul_hi_u64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<Uint128>(a) * b) >> 64);
#endif
}

}  // namespace detail

/// Unsigned division and remainder by a divisor fixed when the struct is made (on the host). A
/// POD: it travels inside a kernel body's parameter block. A zeroed one is not usable.
struct FastDivmod {
  uint64_t divisor;
  uint64_t multiplier;  // floor(2^64 * (2^l - d) / d) + 1, l = ceil(log2 d)
  uint32_t shift1;      // min(l, 1)
  uint32_t shift2;      // max(l - 1, 0)

  /// The divider of `d`, 1 <= d <= 2^63 (the caller checks; a positive int64 always fits).
  static FastDivmod make(uint64_t d) {
    FastDivmod f;
    f.divisor = d;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    const detail::Uint128 num = static_cast<detail::Uint128>((uint64_t{1} << l) - d) << 64;
    f.multiplier = static_cast<uint64_t>(num / d) + 1;
    f.shift1 = l < 1 ? l : 1;
    f.shift2 = l > 1 ? l - 1 : 0;
    return f;
  }

  /// n / divisor.
  PAGEDKV_HOST_DEVICE uint64_t udiv(uint64_t n) const {
    const uint64_t t = detail::mul_hi_u64(multiplier, n);
    return (t + ((n - t) >> shift1)) >> shift2;
  }

  /// n / divisor and n % divisor for a non-negative signed n (index spaces, slots, positions).
  PAGEDKV_HOST_DEVICE void divmod(int64_t n, int64_t& quotient, int64_t& remainder) const {
    const uint64_t q = udiv(static_cast<uint64_t>(n));
    quotient = static_cast<int64_t>(q);
    remainder = n - static_cast<int64_t>(q * divisor);
  }

  /// n / divisor for a non-negative signed n.
  PAGEDKV_HOST_DEVICE int64_t div(int64_t n) const {
    return static_cast<int64_t>(udiv(static_cast<uint64_t>(n)));
  }
};

}  // namespace pagedkv::kernels
