// CUDA runtime errors turned into a Status carrying the error name, the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "pagedkv/status.hpp"

namespace pagedkv::cuda {

/// kResourceExhausted for allocation failures, kUnavailable when there is no usable device,
/// kInternal otherwise.
inline Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return ok_status();
  std::string message = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) +
                        ") in " + what + " at " + file + ":" + std::to_string(line);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return resource_exhausted(std::move(message));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return unavailable(std::move(message));
    default:
      return internal_error(std::move(message));
  }
}

}  // namespace pagedkv::cuda

#define PAGEDKV_CUDA_STATUS(call) ::pagedkv::cuda::cuda_status((call), #call, __FILE__, __LINE__)
#define PAGEDKV_CUDA_RETURN_IF_ERROR(call) PAGEDKV_RETURN_IF_ERROR(PAGEDKV_CUDA_STATUS(call))
