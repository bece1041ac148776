// DeviceGuard: makes a device current for one call and gives the caller's back afterwards, so a
// server can hold one cache per GPU in one process and keep its own current device. Every call
// of the CUDA backend, and CUB's scan (kernels/scan.cu), runs under one.
#pragma once

#include <cuda_runtime.h>

namespace pagedkv::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) switched_ = cudaSetDevice(device) == cudaSuccess;
    if (!switched_ && previous_ != device) cudaGetLastError();  // the call itself will report
  }
  ~DeviceGuard() {
    if (switched_ && previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

}  // namespace pagedkv::cuda
