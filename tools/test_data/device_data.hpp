// Test and benchmark data made where the backend's memory is: deterministic fills, the first
// difference of two buffers and checksums, run on the device on CUDA (Thrust on the stream) and on
// the host on the CPU backend (Thrust's host system), from one source (device_data_ops.inl). A
// CUDA suite then moves no K/V over PCIe to make its inputs or check its results.
//
// Ordering: on CUDA the fills are queued on `stream` and return at once; first_mismatch and
// checksum wait for their result. On the CPU backend every call first waits for `stream` (its
// queued work) and then runs on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "pagedkv/backend.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/macros.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv::testing {

/// Fills `n` elements of type `dtype` at `dst` (backend memory) with pattern_value(seed, i)
/// (kv_model_value.hpp): random-looking, reproducible, never zero.
Status fill_pattern(Backend& backend, Stream stream, void* dst, int64_t n, DType dtype,
                    uint64_t seed);

/// Keys (part 0) or values (part 1) of one layer as a model hands them to write_kv: `rows` rows
/// of [heads][head_dim] fp16 bits, row r holding token tokens[r] at position positions[r] (both
/// arrays in backend memory), element (r, h, d) = kv_model_bits(positions[r], tokens[r], layer,
/// part, h, d).
struct ModelRows {
  const int64_t* positions = nullptr;
  const TokenId* tokens = nullptr;
  int64_t rows = 0;
  int32_t layer = 0;
  int32_t part = 0;
  int32_t heads = 0;
  int32_t head_dim = 0;
};
Status fill_model_rows(Backend& backend, Stream stream, uint16_t* dst, const ModelRows& rows);

/// The first byte at which two buffers of backend memory differ.
struct Mismatch {
  int64_t index = 0;
  uint8_t want = 0;
  uint8_t got = 0;
};
/// nullopt when the `bytes` bytes at `want` and `got` are equal.
StatusOr<std::optional<Mismatch>> first_mismatch(Backend& backend, Stream stream, const void* want,
                                                 const void* got, size_t bytes);

/// A 64-bit checksum of `bytes` bytes of backend memory: the sum over its 8-byte little-endian
/// words w_i (the last one zero-padded) of checksum_term(i, w_i). Order-sensitive (a word moved
/// to another index changes it), equal on both backends for equal bytes.
StatusOr<uint64_t> checksum(Backend& backend, Stream stream, const void* data, size_t bytes);

/// One word's term of checksum(): splitmix64 of the word mixed with its index.
PAGEDKV_HOST_DEVICE uint64_t checksum_term(uint64_t index, uint64_t word) {
  uint64_t x = word ^ (index * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace pagedkv::testing
