// Model shapes for pagedkv-sim: named presets and the cache configuration they give.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace sim {

/// The KV shape of a model: what a cache block's size depends on.
struct ModelShape {
  std::string name;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

/// The presets `--model` accepts, the small default ("tiny") first.
const std::vector<ModelShape>& model_presets();

/// The preset called `name`; kNotFound lists the known names.
StatusOr<ModelShape> find_model(const std::string& name);

/// Blocks of `block_bytes` that fit in `gib` GiB (rounded down), at least 0.
int64_t blocks_in_gib(double gib, int64_t block_bytes);

}  // namespace sim
}  // namespace pagedkv
