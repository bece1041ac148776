// The reference model of the runtime tests: the K/V of a token is a pure function of its
// position and token id (and layer, part, head, dim), so whatever prefix reuse, copy-on-write
// and tier moves happened, a sequence's gathered bytes follow from its token list alone.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv_model_value.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::testing {

/// A distinct, never-zero fp16 value (bits) for one element (kv_model_value.hpp).
inline uint16_t kv_value(int64_t pos, TokenId token, int32_t layer, int32_t part, int32_t head,
                         int32_t d) {
  return kv_model_bits(pos, token, layer, part, head, d);
}

/// Keys (part 0) or values (part 1) of `tokens` at positions start.. for one layer, token-major
/// [n, kv_heads, head_dim] fp16 bits, as a model would hand them to write_kv.
inline std::vector<uint16_t> model_rows(const CacheConfig& c, int32_t layer, int32_t part,
                                        const std::vector<TokenId>& tokens, int64_t start) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  std::vector<uint16_t> out(static_cast<size_t>(n * row));
  for (int64_t t = 0; t < n; ++t)
    for (int32_t h = 0; h < c.num_kv_heads; ++h)
      for (int32_t d = 0; d < c.head_dim; ++d)
        out[static_cast<size_t>(t * row + h * c.head_dim + d)] =
            kv_value(start + t, tokens[static_cast<size_t>(t)], layer, part, h, d);
  return out;
}

/// Keys (part 0) or values (part 1) of a decode step's new tokens for one layer: token
/// `next[r]` at position `positions[r]` in row r, then zero rows up to `rows` (a padded batch),
/// [rows, kv_heads, head_dim] fp16 bits.
inline std::vector<uint16_t> step_rows(const CacheConfig& c, int32_t layer, int32_t part,
                                       const std::vector<TokenId>& next,
                                       const std::vector<int64_t>& positions, size_t rows) {
  const size_t row = static_cast<size_t>(c.num_kv_heads) * static_cast<size_t>(c.head_dim);
  std::vector<uint16_t> out(rows * row, 0);
  for (size_t r = 0; r < next.size(); ++r) {
    const std::vector<uint16_t> one = model_rows(c, layer, part, {next[r]}, positions[r]);
    std::copy(one.begin(), one.end(), out.begin() + static_cast<std::ptrdiff_t>(r * row));
  }
  return out;
}

}  // namespace pagedkv::testing
