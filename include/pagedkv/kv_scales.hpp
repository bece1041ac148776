// Dequantisation scales of an fp8 pool: stored = fp8(x / scale), read = fp8 * scale.
//
// Shared by the data-plane ops (host API), the kernel bodies and the device view, so the scale a
// kernel reads is the scale the write applied. Compiles with any C++17 compiler.
#pragma once

#include <cstdint>

#include "pagedkv/layout.hpp"
#include "pagedkv/macros.hpp"

namespace pagedkv {

/// How finely an fp8 pool is scaled. Scale arrays always cover every layer of the pool, so one
/// array serves the one-layer ops, the all-layers write and the device view alike.
enum class ScaleGranularity : int32_t {
  kNone = 0,      // no scaling (scale 1); the only choice for fp16/bf16/fp32 pools
  kPerLayer = 1,  // k[layer], v[layer]: device arrays of num_layers floats
  kPerHead = 2,   // k[layer * num_kv_heads + head]: device arrays of num_layers * num_kv_heads
};

/// Device pointers to the key and value scales of an fp8 pool. Trivially copyable.
struct KvScales {
  const float* k = nullptr;
  const float* v = nullptr;
  ScaleGranularity granularity = ScaleGranularity::kNone;

  /// The scale of (part, layer, head); 1 when unscaled. Reads device memory.
  PAGEDKV_HOST_DEVICE float get(KvPart part, int32_t layer, int32_t head,
                                int32_t num_kv_heads) const {
    if (granularity == ScaleGranularity::kNone) return 1.0f;
    const float* s = part == KvPart::kKey ? k : v;
    const int64_t i = granularity == ScaleGranularity::kPerLayer
                          ? static_cast<int64_t>(layer)
                          : static_cast<int64_t>(layer) * num_kv_heads + head;
    return s[i];
  }
};

}  // namespace pagedkv
