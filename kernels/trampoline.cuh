// The generic __global__ trampoline: one kernel template that runs any body over an index space.
#pragma once

#include <cstring>

#include "kernels/launch.cuh"

namespace pagedkv::cuda {

inline constexpr int kThreadsPerBlock = 256;
// Whole warps: PagedRowBody gives a row a power of two of consecutive indices (up to 32 when rows
// are many, whole warps up to 256 when they are few) and counts on a warp holding whole groups of
// them, or a group holding whole warps (the grid stride is a multiple of the block, so this holds
// in every pass).
static_assert(kThreadsPerBlock % 32 == 0, "blocks of whole warps");

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
cudaError_t resident_blocks_per_sm(int* blocks) {
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, body_trampoline<Body>,
                                                                      kThreadsPerBlock, 0);
  if (e != cudaSuccess) cudaGetLastError();  // reported through the return value only
  return e;
}

template <typename Body>
cudaError_t launch_body(const void* params, int64_t num_items, cudaStream_t stream,
                        int max_blocks) {
  if (num_items <= 0) return cudaSuccess;
  Body body;
  std::memcpy(static_cast<void*>(&body), params, sizeof(Body));
  const int64_t wanted = (num_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int blocks = static_cast<int>(wanted < max_blocks ? wanted : max_blocks);
  // cudaLaunchKernel reports this launch's own error. After <<<>>>, cudaPeekAtLastError would also
  // report any earlier failed call on the thread (a failed allocation, say) as this launch's.
  int64_t n = num_items;
  void* args[] = {static_cast<void*>(&body), static_cast<void*>(&n)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&body_trampoline<Body>),
                          dim3(static_cast<unsigned>(blocks)), dim3(kThreadsPerBlock), args, 0,
                          stream);
}

}  // namespace pagedkv::cuda

/// Instantiates the launcher of one body type in the including .cu file.
#define PAGEDKV_INSTANTIATE_CUDA_LAUNCH(Body)                                                     \
  template cudaError_t pagedkv::cuda::launch_body<Body>(const void*, int64_t, cudaStream_t, int); \
  template cudaError_t pagedkv::cuda::resident_blocks_per_sm<Body>(int*)
