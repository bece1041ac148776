// CUDA launchers of the paged row and block copy bodies. Instantiated once per body; dtype
// variants are template functions inside the body, never per shape.
#include "kernels/paged_copy.hpp"
#include "kernels/trampoline.cuh"

// A row's lanes (up to kMaxRowLanes, a power of two) must sit in one block of whole warps.
static_assert(::pagedkv::cuda::kThreadsPerBlock % ::pagedkv::kernels::kMaxRowLanes == 0,
              "a row's lanes within one block");

PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::PagedRowBody);
PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::PagedRowRawBody);
PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::CopyBlocksBody);
