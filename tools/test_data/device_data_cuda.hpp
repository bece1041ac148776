// The CUDA side of device_data.hpp (device_data_cuda.cu, or device_data_cuda_stub.cpp in a build
// without CUDA, which answers kUnavailable): each runs on the native stream `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device_data.hpp"

namespace pagedkv::testing::device_data_detail {

Status cuda_fill_pattern(void* stream, void* dst, int64_t n, DType dtype, uint64_t seed);
Status cuda_fill_model_rows(void* stream, uint16_t* dst, const ModelRows& rows);
/// The first differing byte's index, -1 when equal.
StatusOr<int64_t> cuda_mismatch_index(void* stream, const void* want, const void* got,
                                      size_t bytes);
StatusOr<uint64_t> cuda_checksum(void* stream, const void* data, size_t bytes);

}  // namespace pagedkv::testing::device_data_detail
