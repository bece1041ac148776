// Scoped NVTX ranges so that Nsight Systems shows every public operation by name.
// Header-only nvtx3 from the CUDA Toolkit; compiled out when the build has no CUDA.
#pragma once

#include "pagedkv/status.hpp"  // PAGEDKV_CONCAT_

#if defined(PAGEDKV_WITH_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace pagedkv::detail {

/// Pushes an NVTX range named `name` (a string literal) for the lifetime of the object.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#if defined(PAGEDKV_WITH_NVTX)
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if defined(PAGEDKV_WITH_NVTX)
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace pagedkv::detail

#define PAGEDKV_NVTX_RANGE(name) \
  ::pagedkv::detail::NvtxRange PAGEDKV_CONCAT_(pagedkv_nvtx_range_, __LINE__)(name)
