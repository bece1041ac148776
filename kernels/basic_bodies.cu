// CUDA launchers of the basic bodies.
#include "kernels/basic_bodies.hpp"
#include "kernels/trampoline.cuh"

PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::FillBody);
PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::IotaBody);
PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::SpinBody);
