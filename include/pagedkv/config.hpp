// The cache configuration: model shape, pool sizes, element type, layout and policies.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/dtype.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {

/// Order of a page's elements. NHD: [block_size][kv_heads][head_dim] (default);
/// HND: [kv_heads][block_size][head_dim].
enum class PageLayout : uint8_t { kNHD = 0, kHND = 1 };

/// What the planner evicts or offloads when a block is needed and none is free.
/// kNone never takes blocks from sequences (cached prefix blocks are still reclaimed).
enum class EvictionPolicy : uint8_t { kNone = 0, kLru = 1, kFifo = 2 };

/// What a page holds per token. kKeyValue: keys and values, num_kv_heads x head_dim each.
/// kLatent: one compressed latent vector per token and no values (MLA, DeepSeek V2/V3, Kimi):
/// num_kv_heads is 1 and head_dim is the latent width, the `ckv` part (head_dim - rope_dim
/// elements) followed by the `kpe` part (rope_dim), FlashInfer's MLA layout as two slices of one
/// page.
enum class KvKind : uint8_t { kKeyValue = 0, kLatent = 1 };

/// Which executor runs the data plane. kNull runs none: copies and kernels are dropped and the
/// pools cost no memory (null_backend.hpp), for sizing runs that need the decisions only.
enum class BackendKind : uint8_t { kAuto = 0, kCpu = 1, kCuda = 2, kNull = 3 };

/// Paged (block pool) or dense (per-sequence contiguous buffers, the seed's default).
enum class CacheMode : uint8_t { kPaged = 0, kDense = 1 };

const char* page_layout_name(PageLayout l);
const char* eviction_policy_name(EvictionPolicy p);
const char* backend_kind_name(BackendKind k);

/// One KV group of a model: layers that share a page shape and an attention window, held in
/// their own pools (CacheConfig::groups). A model whose layers alternate sliding-window and
/// full attention (gpt-oss, Gemma 2/3) has two groups; an MLA model (DeepSeek V2/V3, Kimi) has
/// one latent group.
struct KvGroup {
  std::string name;             // for messages and reports ("full", "window", "mla")
  std::vector<int32_t> layers;  // the model's layer indices in this group, each in one group
  int32_t num_kv_heads = 0;     // kLatent: 1
  int32_t head_dim = 0;         // kLatent: the latent width (`latent_dim`, ckv + kpe)
  DType dtype = DType::kFloat16;
  KvKind kv_kind = KvKind::kKeyValue;
  int32_t rope_dim = 0;        // kLatent: the kpe part
  int32_t sliding_window = 0;  // tokens; 0: full attention
  int64_t num_device_blocks = 0;
  int64_t num_host_blocks = 0;

  /// An MLA group: one latent vector of `latent_dim` elements per token (the last `rope_dim`
  /// of them the rotary part), keys only.
  static KvGroup latent(std::string name, std::vector<int32_t> layers, int32_t latent_dim,
                        int32_t rope_dim, DType dtype = DType::kFloat16) {
    KvGroup g;
    g.name = std::move(name);
    g.layers = std::move(layers);
    g.num_kv_heads = 1;
    g.head_dim = latent_dim;
    g.dtype = dtype;
    g.kv_kind = KvKind::kLatent;
    g.rope_dim = rope_dim;
    return g;
  }
};

/// Everything needed to create a cache. `validate()` names the first offending field.
/// Where a model layer lives: its KV group and its index among the group's layers.
struct LayerGroup {
  int32_t group = 0;
  int32_t layer = 0;  // the layer's index inside its group
};

struct CacheConfig {
  // Model shape.
  int32_t num_layers = 4;
  int32_t num_kv_heads = 4;
  int32_t head_dim = 64;

  // Pools.
  int32_t block_size = 16;  // tokens per block
  int64_t num_device_blocks = 256;
  int64_t num_host_blocks = 0;  // pinned host tier; 0 disables offload to host
  DType dtype = DType::kFloat16;
  PageLayout page_layout = PageLayout::kNHD;

  // Policies.
  CacheMode mode = CacheMode::kPaged;
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  bool enable_prefix_caching = true;
  /// With a host tier: a cached prefix block evicted from the device moves to the host tier
  /// (where a later prompt can still hit it) instead of being dropped; host blocks nobody
  /// references are then dropped least recently used first.
  bool cache_prefixes_on_host = true;
  int32_t max_sequence_length = 1 << 20;  // tokens; reserve past it is kOutOfRange

  // Attention shape of the layers this cache holds (one KV group of a model).
  /// Sliding window in tokens, 0 for full attention. With a window, the next token attends to
  /// at most the last `sliding_window` committed tokens, so a sequence keeps only the blocks
  /// holding them (plus the ones being filled); blocks that fall out of the window are released
  /// at once (kept as evictable prefix cache when they are registered). At least block_size.
  int32_t sliding_window = 0;
  KvKind kv_kind = KvKind::kKeyValue;
  /// kLatent only: the rotary (`kpe`) part at the end of each latent vector, in elements
  /// (DeepSeek: 64 of 576); 0 < rope_dim < head_dim.
  int32_t rope_dim = 0;

  // Dense mode knobs (seed compatible).
  int32_t dense_initial_length = 256;
  int32_t dense_max_free_buffers = 8;

  BackendKind backend = BackendKind::kAuto;

  /// The model as KV groups (ModelKvCache). Empty: one group, every layer, with the shape,
  /// window and pool sizes above (today's uniform config). When set, each group brings its own
  /// shape, window and pool sizes, and the fields above give the rest: num_layers (the model's),
  /// block_size, the policies, max_sequence_length and the backend.
  std::vector<KvGroup> groups;

  /// 1 without groups, else groups.size().
  int32_t num_groups() const { return groups.empty() ? 1 : static_cast<int32_t>(groups.size()); }
  /// The one-group config of group `g` (its layers numbered 0 .. layers.size() - 1); the config
  /// itself without groups. `g` must be below num_groups().
  CacheConfig group_config(int32_t g) const;
  /// Each model layer's group and index there, by model layer (without groups, group 0 and the
  /// layer itself). Needs a validated config.
  std::vector<LayerGroup> layer_groups() const;

  /// Ok, or kInvalidArgument whose message starts with the field name ("head_dim: ...", and for
  /// a group "groups[1] (window): sliding_window: ..."). A shape whose block, device pool, host
  /// pool (or dense buffer) byte size overflows int64 names the field whose factor overflowed.
  Status validate() const;

  /// Bytes of one block (all layers, keys and values, or latents for kLatent); -1 when that
  /// overflows int64.
  int64_t block_bytes() const;

  /// Blocks a decoding sequence holds in this one-group config (a group_config(g) of a model):
  /// `context` committed tokens and the slot of the next one reserved, context / block_size + 1;
  /// with a sliding window only those holding the last `sliding_window` tokens and the next
  /// one, at most ceil(sliding_window / block_size) + 1. Needs block_size >= 1,
  /// sliding_window >= 0 and context >= 0 (a validated config).
  int64_t blocks_per_sequence(int64_t context) const;
  /// This config with its pools sized from byte budgets. Without groups: the budgets in blocks
  /// (rounded down). With groups: each budget split between them in proportion to the bytes a
  /// sequence of `context` tokens holds in each (blocks_per_sequence x block bytes), so that
  /// all groups fill at the same number of such sequences, each group's blocks rounded down and
  /// at least one device block; the top-level num_device_blocks / num_host_blocks become the
  /// totals. kInvalidArgument for a negative budget, context < 1, block_size < 1, a negative
  /// window or a shape whose block bytes overflow (naming the group). The result is not
  /// validated: validate() (or create) does.
  StatusOr<CacheConfig> with_pools(int64_t device_bytes, int64_t host_bytes, int64_t context) const;
  /// Bytes of one page (one layer's keys, values or latents of one block); -1 when that overflows
  /// int64.
  int64_t page_bytes() const;
};

/// `layers[layer]` of a CacheConfig::layer_groups(), or kOutOfRange naming the layer.
StatusOr<LayerGroup> find_layer_group(const std::vector<LayerGroup>& layers, int32_t layer);

}  // namespace pagedkv
