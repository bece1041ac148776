// CUDA launchers of the paged row and block copy bodies. Instantiated once per body; dtype
// variants are template functions inside the body, never per shape.
#include "kernels/paged_copy.hpp"
#include "kernels/trampoline.cuh"

PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::PagedRowBody);
PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::CopyBlocksBody);
