// The generic __global__ trampoline: one kernel template that runs any body over an index space.
#pragma once

#include <cstring>

#include "kernels/launch.cuh"

namespace pagedkv::cuda {

inline constexpr int kThreadsPerBlock = 256;

template <typename Body>
__global__ void __launch_bounds__(kThreadsPerBlock)
    body_trampoline(const Body body, const int64_t num_items) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_items;
       i += stride) {
    body(i);
  }
}

template <typename Body>
cudaError_t launch_body(const void* params, int64_t num_items, cudaStream_t stream,
                        int max_blocks) {
  if (num_items <= 0) return cudaSuccess;
  Body body;
  std::memcpy(static_cast<void*>(&body), params, sizeof(Body));
  const int64_t wanted = (num_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int blocks = static_cast<int>(wanted < max_blocks ? wanted : max_blocks);
  body_trampoline<Body><<<blocks, kThreadsPerBlock, 0, stream>>>(body, num_items);
  return cudaPeekAtLastError();
}

}  // namespace pagedkv::cuda

/// Instantiates the launcher of one body type in the including .cu file.
#define PAGEDKV_INSTANTIATE_CUDA_LAUNCH(Body) \
  template cudaError_t pagedkv::cuda::launch_body<Body>(const void*, int64_t, cudaStream_t, int)
