// The K/V model of the tests, soak and benchmarks: every element a pure function of (position,
// token, layer, K or V, head, dim), so a sequence's bytes follow from its token list alone,
// whatever prefix reuse, copy-on-write and tier moves happened. Host and device code compute the
// same value (the device-side fills of device_data.hpp use it too).
#pragma once

#include <cstdint>

#include "pagedkv/dtype.hpp"
#include "pagedkv/macros.hpp"

namespace pagedkv::testing {

/// The hash's modulus and the primes its coordinates are multiplied by.
struct KvModelPrimes {
  static constexpr int64_t kModulus = 4093;
  static constexpr int64_t kPos = 40503;
  static constexpr int64_t kToken = 2654435761LL;
  static constexpr int64_t kLayer = 97;
  static constexpr int64_t kPart = 7919;
  static constexpr int64_t kHead = 131;
  static constexpr int64_t kDim = 17;
};

/// The element's hash in [0, KvModelPrimes::kModulus): the coordinates times distinct primes,
/// summed. `pos` and `token` must not be negative.
PAGEDKV_HOST_DEVICE int64_t kv_model_hash(int64_t pos, int32_t token, int32_t layer, int32_t part,
                                          int32_t head, int32_t d) {
  using P = KvModelPrimes;
  return (pos * P::kPos + token * P::kToken + layer * P::kLayer + part * P::kPart +
          head * P::kHead + d * P::kDim) %
         P::kModulus;
}

/// The value of a hash: 0.25 + h / 1024, never zero, never NaN, exact in fp16.
PAGEDKV_HOST_DEVICE float kv_model_float(int64_t hash) {
  return 0.25f + static_cast<float>(hash) / 1024.0f;
}

/// The fp16 bits of one element.
PAGEDKV_HOST_DEVICE uint16_t kv_model_bits(int64_t pos, int32_t token, int32_t layer, int32_t part,
                                           int32_t head, int32_t d) {
  return float_to_half_bits(kv_model_float(kv_model_hash(pos, token, layer, part, head, d)));
}

/// Element i of a pattern fill (device_data.hpp's fill_pattern): a pure function of (seed, i),
/// finite and never zero, magnitude in [0.0625, 2.05), either sign; exact in fp16 and bf16.
PAGEDKV_HOST_DEVICE float pattern_value(uint64_t seed, int64_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's finalizer
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  const float magnitude = 0.0625f + static_cast<float>(x & 0x7f) / 64.0f;
  return (x >> 63) != 0 ? -magnitude : magnitude;
}

}  // namespace pagedkv::testing
