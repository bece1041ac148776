// Small bodies used to poison buffers and to test the executors themselves.
#pragma once

#include <cstdint>

#include "pagedkv/macros.hpp"

namespace pagedkv::kernels {

/// dst[i] = value, over 32-bit words.
struct FillBody {
  uint32_t* dst;
  uint32_t value;
  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const { dst[i] = value; }
};

/// out[i] = start + i * step.
struct IotaBody {
  int64_t* out;
  int64_t start;
  int64_t step;
  PAGEDKV_HOST_DEVICE void operator()(int64_t i) const { out[i] = start + i * step; }
};

}  // namespace pagedkv::kernels
