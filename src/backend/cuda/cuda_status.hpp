// CUDA runtime errors turned into a Status carrying the error name, the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "pagedkv/status.hpp"

namespace pagedkv::cuda {

/// True for the errors that corrupt the CUDA context ("any further CUDA work will return the
/// same error"): a kernel fault, a hardware error. Every later call fails, so the backend stops.
inline bool is_sticky_error(cudaError_t err) {
  switch (err) {
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
      return true;
    default:
      break;
  }
  // By value, as older toolkits lack the names: cudaErrorContained (226), cudaErrorTensorMemoryLeak
  // (721), cudaErrorMpsClientTerminated (810), cudaErrorExternalDevice (911).
  const int code = static_cast<int>(err);
  return code == 226 || code == 721 || code == 810 || code == 911;
}

/// kResourceExhausted for allocation failures, kUnavailable when there is no usable device,
/// kInternal otherwise. A failed call also sets the runtime's last-error slot, which
/// cudaPeekAtLastError (CUB's launches, for one) would report again for unrelated later calls;
/// a non-sticky error is cleared from it here, once. Sticky ones cannot be cleared.
inline Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return ok_status();
  if (!is_sticky_error(err)) (void)cudaGetLastError();
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
