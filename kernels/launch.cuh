// Declaration of the CUDA launcher of a kernel body. The CUDA backend's dispatcher calls it for
// every body in PAGEDKV_KERNEL_LIST; each body's explicit instantiation lives in the kernels/*.cu
// file of its family (PAGEDKV_INSTANTIATE_CUDA_LAUNCH), so families compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedkv::cuda {

/// Launches `Body` (whose bytes are at `params`) over [0, num_items) on `stream` with a
/// grid-stride loop of at most `max_blocks` blocks; returns the launch's own error
/// (cudaLaunchKernel's result), never one left over from an earlier call.
template <typename Body>
cudaError_t launch_body(const void* params, int64_t num_items, cudaStream_t stream, int max_blocks);

/// How many blocks of `Body`'s trampoline fit on one SM of the current device at once
/// (cudaOccupancyMaxActiveBlocksPerMultiprocessor: registers, threads, shared memory). The
/// backend caps each body's grid at that many blocks per SM: one full wave, then grid-stride.
template <typename Body>
cudaError_t resident_blocks_per_sm(int* blocks);

}  // namespace pagedkv::cuda
