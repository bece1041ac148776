// device_data.hpp on a CUDA stream: Thrust's CUDA system, fills queued without a wait
// (par_nosync), the mismatch and the checksum waiting for their answer.
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>

#include <exception>
#include <string>

#include "device_data_cuda.hpp"
#include "device_data_ops.inl"

namespace pagedkv::testing::device_data_detail {
namespace {

cudaStream_t native(void* stream) { return static_cast<cudaStream_t>(stream); }

/// Runs `work`, turning a Thrust (CUDA) error into a Status.
template <typename Work>
Status guarded(const char* what, Work&& work) {
  try {
    work();
    return ok_status();
  } catch (const std::exception& e) {
    (void)cudaGetLastError();  // clear it: a later, unrelated call would report it again
    return internal_error(std::string(what) + ": " + e.what());
  }
}

}  // namespace

Status cuda_fill_pattern(void* stream, void* dst, int64_t n, DType dtype, uint64_t seed) {
  return guarded("fill_pattern", [&] {
    pattern_fill(thrust::cuda::par_nosync.on(native(stream)), dst, n, dtype, seed);
  });
}

Status cuda_fill_model_rows(void* stream, uint16_t* dst, const ModelRows& rows) {
  return guarded("fill_model_rows",
                 [&] { model_rows_fill(thrust::cuda::par_nosync.on(native(stream)), dst, rows); });
}

StatusOr<int64_t> cuda_mismatch_index(void* stream, const void* want, const void* got,
                                      size_t bytes) {
  int64_t at = -1;
  PAGEDKV_RETURN_IF_ERROR(guarded("first_mismatch", [&] {
    at = mismatch_index(thrust::cuda::par.on(native(stream)), want, got, bytes);
  }));
  return at;
}

StatusOr<uint64_t> cuda_checksum(void* stream, const void* data, size_t bytes) {
  uint64_t sum = 0;
  PAGEDKV_RETURN_IF_ERROR(guarded(
      "checksum", [&] { sum = checksum_of(thrust::cuda::par.on(native(stream)), data, bytes); }));
  return sum;
}

}  // namespace pagedkv::testing::device_data_detail
