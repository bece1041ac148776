// The one source of device_data.hpp's work, over a Thrust execution policy: the CPU backend's
// (Thrust's host system, device_data.cpp) and the CUDA backend's (the stream's,
// device_data_cuda.cu)
// instantiate the same templates, as the kernel bodies serve both backends.
#pragma once

#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/mismatch.h>
#include <thrust/tabulate.h>
#include <thrust/transform_reduce.h>

#include <cstdint>

#include "device_data.hpp"
#include "kv_model_value.hpp"

namespace pagedkv::testing::device_data_detail {

/// A value's bits in the storage type of its dtype (uint8_t: fp8, uint16_t: fp16 or bf16,
/// uint32_t: fp32).
PAGEDKV_HOST_DEVICE uint8_t dtype_bits(uint8_t*, DType, float x) {
  return float_to_fp8_e4m3_bits(x);
}
PAGEDKV_HOST_DEVICE uint16_t dtype_bits(uint16_t*, DType dtype, float x) {
  return dtype == DType::kBFloat16 ? float_to_bf16_bits(x) : float_to_half_bits(x);
}
PAGEDKV_HOST_DEVICE uint32_t dtype_bits(uint32_t*, DType, float x) { return detail::float_bits(x); }

/// Element i of a pattern fill, as the bits of `T`.
template <typename T>
struct PatternElement {
  DType dtype;
  uint64_t seed;
  PAGEDKV_HOST_DEVICE T operator()(int64_t i) const {
    return dtype_bits(static_cast<T*>(nullptr), dtype, pattern_value(seed, i));
  }
};

template <typename T, typename Policy>
void tabulate_pattern(const Policy& policy, void* dst, int64_t n, DType dtype, uint64_t seed) {
  T* out = static_cast<T*>(dst);
  thrust::tabulate(policy, out, out + n, PatternElement<T>{dtype, seed});
}

template <typename Policy>
void pattern_fill(const Policy& policy, void* dst, int64_t n, DType dtype, uint64_t seed) {
  switch (dtype_size(dtype)) {
    case 1:
      return tabulate_pattern<uint8_t>(policy, dst, n, dtype, seed);
    case 2:
      return tabulate_pattern<uint16_t>(policy, dst, n, dtype, seed);
    default:
      return tabulate_pattern<uint32_t>(policy, dst, n, dtype, seed);
  }
}

/// Element i of a [rows][heads][head_dim] model-rows buffer.
struct ModelRowElement {
  ModelRows rows;
  PAGEDKV_HOST_DEVICE uint16_t operator()(int64_t i) const {
    const int64_t d = i % rows.head_dim;
    const int64_t h = (i / rows.head_dim) % rows.heads;
    const int64_t r = i / (int64_t{rows.head_dim} * rows.heads);
    return kv_model_bits(rows.positions[r], rows.tokens[r], rows.layer, rows.part,
                         static_cast<int32_t>(h), static_cast<int32_t>(d));
  }
};

template <typename Policy>
void model_rows_fill(const Policy& policy, uint16_t* dst, const ModelRows& rows) {
  const int64_t n = rows.rows * rows.heads * rows.head_dim;
  thrust::tabulate(policy, dst, dst + n, ModelRowElement{rows});
}

/// Index of the first differing byte, or -1.
template <typename Policy>
int64_t mismatch_index(const Policy& policy, const void* want, const void* got, size_t bytes) {
  const uint8_t* a = static_cast<const uint8_t*>(want);
  const uint8_t* b = static_cast<const uint8_t*>(got);
  const auto at = thrust::mismatch(policy, a, a + bytes, b);
  return at.first == a + bytes ? -1 : static_cast<int64_t>(at.first - a);
}

/// checksum_term of word i: whole words in one load where the buffer is 8-byte aligned, the
/// zero-padded tail (and an unaligned buffer) byte by byte, little-endian.
struct WordTerm {
  const uint8_t* data;
  uint64_t bytes;
  bool aligned;
  PAGEDKV_HOST_DEVICE uint64_t operator()(uint64_t i) const {
    const uint64_t first = i * 8;
    uint64_t word = 0;
    if (aligned && first + 8 <= bytes) {
      word = reinterpret_cast<const uint64_t*>(data)[i];
    } else {
      for (uint64_t k = 0; k < 8 && first + k < bytes; ++k) {
        word |= uint64_t{data[first + k]} << (8 * k);
      }
    }
    return checksum_term(i, word);
  }
};

template <typename Policy>
uint64_t checksum_of(const Policy& policy, const void* data, size_t bytes) {
  const uint64_t words = (uint64_t{bytes} + 7) / 8;
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 8 == 0;
  return thrust::transform_reduce(
      policy, thrust::counting_iterator<uint64_t>(0), thrust::counting_iterator<uint64_t>(words),
      WordTerm{static_cast<const uint8_t*>(data), uint64_t{bytes}, aligned}, uint64_t{0},
      thrust::plus<uint64_t>());
}

}  // namespace pagedkv::testing::device_data_detail
