// CUB's DeviceScan behind a host-compilable interface (kernels/scan.hpp), and the launcher of the
// scan body.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include "backend/cuda/device_guard.cuh"
#include "kernels/scan.hpp"
#include "kernels/trampoline.cuh"

PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::ExclusiveScanBody);

namespace pagedkv::cuda {
namespace {

// The error of a failed call, cleared (when it is not sticky) so the application's next CUDA
// call does not find it.
int reported(cudaError_t err) {
  if (err != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(err);
}

}  // namespace

size_t cub_inclusive_sum_scratch_bytes(int64_t n, int device) {
  const DeviceGuard guard(device);
  size_t bytes = 0;
  const cudaError_t err =
      cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), static_cast<int>(n));
  return reported(err) == 0 ? bytes : 0;
}

int cub_exclusive_indptr(const int32_t* in, int32_t* out, int64_t n, void* scratch,
                         size_t scratch_bytes, void* stream, int device) {
  const DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  // out[0] = 0; out[1..n] = inclusive sums: the exclusive indptr without a separate pass.
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(int32_t), s);
  if (err != cudaSuccess) return reported(err);
  if (n == 0) return 0;
  size_t bytes = scratch_bytes;
  err = cub::DeviceScan::InclusiveSum(scratch, bytes, in, out + 1, static_cast<int>(n), s);
  return reported(err);
}

const char* cuda_error_name(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }

}  // namespace pagedkv::cuda
