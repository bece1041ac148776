// The workload's model of the K/V bytes: each element is a pure function of (position, token,
// layer, K or V, head, dim), so a sequence's bytes follow from its token list alone. The same
// function as tests/runtime/kv_model.hpp: fp16 bits of 0.25 + h / 1024, h a hash modulo 4093,
// never zero and never NaN.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/control_types.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::soak {

/// Model values, one at a time or a token's row at a time (from a table of the 4093 values).
class KvValues {
 public:
  KvValues() : table_(static_cast<size_t>(kModulus)) {
    for (int64_t h = 0; h < kModulus; ++h) table_[static_cast<size_t>(h)] = bits(h);
  }

  /// The fp16 bits of one element.
  static uint16_t value(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t head,
                        int32_t dim) {
    return bits(
        (pos * kPos + token * kToken + layer * kLayer + part * kPart + head * kHead + dim * kDim) %
        kModulus);
  }

  /// Writes the [heads][dim] fp16 bits of one token's keys (part 0) or values (part 1) in one
  /// layer to `out`. `pos` and `token` must not be negative (the partial sums then add).
  void row(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t heads, int32_t dim,
           uint16_t* out) const {
    const int64_t base = (pos * kPos + token * kToken + layer * kLayer + part * kPart) % kModulus;
    for (int32_t h = 0; h < heads; ++h) {
      int64_t v = (base + h * kHead) % kModulus;
      for (int32_t d = 0; d < dim; ++d) {
        *out++ = table_[static_cast<size_t>(v)];
        v += kDim;
        if (v >= kModulus) v -= kModulus;
      }
    }
  }

 private:
  static constexpr int64_t kModulus = 4093;
  static constexpr int64_t kPos = 40503;
  static constexpr int64_t kToken = 2654435761LL;
  static constexpr int64_t kLayer = 97;
  static constexpr int64_t kPart = 7919;
  static constexpr int64_t kHead = 131;
  static constexpr int64_t kDim = 17;

  static uint16_t bits(int64_t h) {
    return float_to_half_bits(0.25f + static_cast<float>(h) / 1024.0f);
  }

  std::vector<uint16_t> table_;
};

}  // namespace pagedkv::soak
