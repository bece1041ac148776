// kv_model.hpp's rows made and checked by the backend (tools/test_data/device_data.hpp): only a
// row's position and token id cross to the device, never K/V, so a CUDA suite at prefill sizes
// spends its time on the device and not on PCIe copies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device_data.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/config.hpp"
#include "support/backend_test.hpp"

namespace pagedkv::testing {

/// Writes model_rows(c, layer, part, tokens, start) to `dst` (backend memory, token-major
/// [n][kv_heads][head_dim] fp16) on `stream`, and waits for it.
inline Status make_model_rows(Backend& backend, Stream stream, void* dst, const CacheConfig& c,
                              int32_t layer, int32_t part, const std::vector<TokenId>& tokens,
                              int64_t start) {
  const size_t n = tokens.size();
  std::vector<int64_t> positions(n);
  for (size_t i = 0; i < n; ++i) positions[i] = start + static_cast<int64_t>(i);
  DeviceBuffer dpos(backend, n * sizeof(int64_t)), dtok(backend, n * sizeof(TokenId));
  dpos.upload(positions);
  dtok.upload(tokens);
  ModelRows rows;
  rows.positions = static_cast<const int64_t*>(dpos.data());
  rows.tokens = static_cast<const TokenId*>(dtok.data());
  rows.rows = static_cast<int64_t>(n);
  rows.layer = layer;
  rows.part = part;
  rows.heads = c.num_kv_heads;
  rows.head_dim = c.head_dim;
  PAGEDKV_RETURN_IF_ERROR(fill_model_rows(backend, stream, static_cast<uint16_t*>(dst), rows));
  return backend.synchronize_stream(stream);  // before the position and token arrays go
}

/// "" when `got` (backend memory, token-major fp16, after the work queued on `stream`) holds
/// model_rows(c, layer, part, tokens, start), else the first differing position and byte.
inline std::string model_rows_difference(Backend& backend, Stream stream, const void* got,
                                         const CacheConfig& c, int32_t layer, int32_t part,
                                         const std::vector<TokenId>& tokens, int64_t start) {
  const size_t row_bytes = static_cast<size_t>(c.num_kv_heads) * c.head_dim * 2;
  DeviceBuffer want(backend, tokens.size() * row_bytes);
  const Status made = make_model_rows(backend, stream, want.data(), c, layer, part, tokens, start);
  if (!made.ok()) return made.to_string();
  auto diff = first_mismatch(backend, stream, want.data(), got, want.bytes());
  if (!diff.ok()) return diff.status().to_string();
  if (!diff->has_value()) return "";
  const Mismatch& m = **diff;
  return "layer " + std::to_string(layer) + (part == 0 ? " K" : " V") + ", position " +
         std::to_string(start + m.index / static_cast<int64_t>(row_bytes)) + ": byte " +
         std::to_string(m.index % static_cast<int64_t>(row_bytes)) + " of the row is " +
         std::to_string(m.got) + ", want " + std::to_string(m.want);
}

}  // namespace pagedkv::testing
