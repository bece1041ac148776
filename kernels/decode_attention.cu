// CUDA launcher of the reference decode attention body.
#include "kernels/decode_attention.hpp"
#include "kernels/trampoline.cuh"

PAGEDKV_INSTANTIATE_CUDA_LAUNCH(::pagedkv::kernels::DecodeAttentionBody);
