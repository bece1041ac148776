// Model shapes for pagedkv-sim: named presets and the cache configuration they give. A preset is
// uniform (every layer the same full-attention K/V shape), hybrid (sliding-window layers next to
// full-attention ones: two KV groups), or MLA (one latent vector per token, keys only).
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
  int32_t head_dim = 0;  // kLatent: the latent width (ckv + kpe)
  /// Hybrid models: the window (tokens) of the local layers; 0: every layer full attention.
  int32_t sliding_window = 0;
  /// Hybrid models: layer i attends globally (full attention) when (i + 1) % global_every == 0,
  /// the others through the window (gpt-oss: 2, Gemma 3: 6).
  int32_t global_every = 0;
  KvKind kv_kind = KvKind::kKeyValue;
  int32_t rope_dim = 0;  // kLatent: the rotary part of the latent
  std::string like;      // the published model the shape follows, for --help and reports
};

/// The presets `--model` accepts, the small default ("tiny") first.
const std::vector<ModelShape>& model_presets();

/// The preset called `name`; kNotFound lists the known names.
StatusOr<ModelShape> find_model(const std::string& name);

/// "32x8x128", "36x8x64, window 128 on 1 of 2 layers", "61 x latent 576 (512 + 64)": the shape
/// in a few words.
std::string shape_summary(const ModelShape& m);

/// Sets the model shape of `config` from `m`: the top-level fields for a uniform or MLA model
/// (no groups, as before presets had groups), else two groups, "window" and "full", each with
/// its layers. Pool sizes are left to CacheConfig::with_pools(). kInvalidArgument when the shape is
/// bad.
Status apply_model(const ModelShape& m, CacheConfig* config);

/// The uniform cache of the same model: every layer full attention (groups without their
/// windows, merged into the top-level fields when they share one page shape), with the pools of
/// `config` left as they are.
CacheConfig uniform_config(const CacheConfig& config);

/// Bytes of one block of the model's uniform cache (uniform_config), -1 on overflow.
int64_t uniform_block_bytes(const CacheConfig& config);

/// Blocks of `block_bytes` that fit in `gib` GiB (rounded down), at least 0.
int64_t blocks_in_gib(double gib, int64_t block_bytes);

}  // namespace sim
}  // namespace pagedkv
