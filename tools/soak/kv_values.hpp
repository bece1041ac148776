// The workload's model of the K/V bytes: each element is a pure function of (position, token,
// layer, K or V, head, dim), so a sequence's bytes follow from its token list alone: the
// function of tools/test_data/kv_model_value.hpp (the tests' and device fills' too), with a row
// at a time from a table of its values.
#pragma once

#include <cstdint>
#include <vector>

#include "kv_model_value.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::soak {

/// Model values, one at a time or a token's row at a time (from a table of the 4093 values).
class KvValues {
  using P = testing::KvModelPrimes;

 public:
  KvValues() : table_(static_cast<size_t>(P::kModulus)) {
    for (int64_t h = 0; h < P::kModulus; ++h) table_[static_cast<size_t>(h)] = bits(h);
  }

  /// The fp16 bits of one element.
  static uint16_t value(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t head,
                        int32_t dim) {
    return testing::kv_model_bits(pos, token, layer, part, head, dim);
  }

  /// Writes the [heads][dim] fp16 bits of one token's keys (part 0) or values (part 1) in one
  /// layer to `out`. `pos` and `token` must not be negative (the partial sums then add).
  void row(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t heads, int32_t dim,
           uint16_t* out) const {
    const int64_t base =
        (pos * P::kPos + token * P::kToken + layer * P::kLayer + part * P::kPart) % P::kModulus;
    for (int32_t h = 0; h < heads; ++h) {
      int64_t v = (base + h * P::kHead) % P::kModulus;
      for (int32_t d = 0; d < dim; ++d) {
        *out++ = table_[static_cast<size_t>(v)];
        v += P::kDim;
        if (v >= P::kModulus) v -= P::kModulus;
      }
    }
  }

 private:
  static uint16_t bits(int64_t h) { return float_to_half_bits(testing::kv_model_float(h)); }

  std::vector<uint16_t> table_;
};

}  // namespace pagedkv::soak
