// Maps each KernelId to the body type that implements it. Both backends expand
// PAGEDKV_KERNEL_LIST to dispatch a KernelLaunch to `Body::operator()(int64_t)` over the index
// space: the CPU backend in a loop, the CUDA backend through the trampoline of trampoline.cuh.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/basic_bodies.hpp"
#include "kernels/decode_attention.hpp"
#include "kernels/paged_copy.hpp"
#include "kernels/scan.hpp"
#include "pagedkv/kernel_id.hpp"

// X(id, body type)
#define PAGEDKV_KERNEL_LIST(X)                                 \
  X(kFill, ::pagedkv::kernels::FillBody)                       \
  X(kIota, ::pagedkv::kernels::IotaBody)                       \
  X(kPagedRows, ::pagedkv::kernels::PagedRowBody)              \
  X(kCopyBlocks, ::pagedkv::kernels::CopyBlocksBody)           \
  X(kExclusiveScan, ::pagedkv::kernels::ExclusiveScanBody)     \
  X(kDecodeAttention, ::pagedkv::kernels::DecodeAttentionBody) \
  X(kPagedRowsRaw, ::pagedkv::kernels::PagedRowRawBody)        \
  X(kSpin, ::pagedkv::kernels::SpinBody)

namespace pagedkv::kernels {

/// sizeof the params (body) struct of a kernel, or 0 for an unknown id.
inline size_t kernel_params_size(KernelId id) {
  switch (id) {
#define PAGEDKV_PARAMS_SIZE_CASE(name, Body)                                                     \
  case KernelId::name:                                                                           \
    static_assert(std::is_trivially_copyable<Body>::value, #Body " must be trivially copyable"); \
    return sizeof(Body);
    PAGEDKV_KERNEL_LIST(PAGEDKV_PARAMS_SIZE_CASE)
#undef PAGEDKV_PARAMS_SIZE_CASE
    default:
      return 0;
  }
}

/// A short name for logs and NVTX ranges.
inline const char* kernel_name(KernelId id) {
  switch (id) {
// The name without its leading 'k' (indexing, not `+ 1`, which clang reads as a mistake).
#define PAGEDKV_NAME_CASE(name, Body) \
  case KernelId::name:                \
    return &(#name)[1];
    PAGEDKV_KERNEL_LIST(PAGEDKV_NAME_CASE)
#undef PAGEDKV_NAME_CASE
    default:
      return "unknown";
  }
}

}  // namespace pagedkv::kernels
