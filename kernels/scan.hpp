// Building an indptr (exclusive prefix sum of sequence lengths) on the device.
//
// The CUDA path is CUB's DeviceScan (kernels/scan.cu), on the stream's native handle;
// ExclusiveScanBody is the CPU backend's path (and is tested on the CPU in both launch shapes).
// This header compiles with any C++17 compiler (no CUDA types).
#pragma once

#include <cstddef>
#include <cstdint>

#include "pagedkv/macros.hpp"

namespace pagedkv::kernels {

/// out[j] = sum(in[0 .. j)) for j in [0, n]. Index i computes out for [i * chunk, (i+1) * chunk)
/// by summing its prefix first: chunk = n + 1 (one index) is a serial scan, chunk = 1 is one
/// output per index (O(n) each; for small batches on the GPU).
struct ExclusiveScanBody {
  const int32_t* in;
  int32_t* out;
  int64_t n;
  int64_t chunk;

  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t begin = i * chunk;
    int64_t end = begin + chunk;
    if (end > n + 1) end = n + 1;
    int32_t sum = 0;
    for (int64_t j = 0; j < begin; ++j) sum += in[j];
    for (int64_t j = begin; j < end; ++j) {
      out[j] = sum;
      if (j < n) sum += in[j];
    }
  }
};

}  // namespace pagedkv::kernels

namespace pagedkv::cuda {

/// Scratch bytes CUB's inclusive int32 sum of n items needs on CUDA device `device` (the
/// backend's: CUB reads the current device's properties); 0 on failure. Defined in scan.cu.
size_t cub_inclusive_sum_scratch_bytes(int64_t n, int device);

/// out[0] = 0, out[1 .. n] = inclusive sum of in[0 .. n) on the CUDA stream `stream` (a
/// cudaStream_t of device `device`), using caller-owned scratch. Returns a cudaError_t as int
/// (0: success). Both calls make `device` current and give the caller's back, and clear the
/// error of a failed call so that it does not reach the application's next CUDA call.
int cub_exclusive_indptr(const int32_t* in, int32_t* out, int64_t n, void* scratch,
                         size_t scratch_bytes, void* stream, int device);

/// The name of a cudaError_t returned above.
const char* cuda_error_name(int error);

}  // namespace pagedkv::cuda
