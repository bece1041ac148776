#include "pagedkv/config.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace pagedkv {

const char* page_layout_name(PageLayout l) { return l == PageLayout::kNHD ? "NHD" : "HND"; }

const char* eviction_policy_name(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::kNone:
      return "none";
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kFifo:
      return "fifo";
  }
  return "unknown";
}

const char* backend_kind_name(BackendKind k) {
  switch (k) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kNull:
      return "null";
  }
  return "unknown";
}

namespace {

Status field_error(const char* field, const std::string& why) {
  return invalid_argument(std::string(field) + ": " + why);
}

bool is_known(DType t) { return static_cast<int>(t) < kNumDTypes; }

// Pages per layer of a block: keys and values, or the one latent page of an MLA cache.
int64_t parts_per_layer(const CacheConfig& c) { return c.kv_kind == KvKind::kLatent ? 1 : 2; }

// Offsets and sizes are int64 and become size_t allocation sizes.
static_assert(sizeof(size_t) >= sizeof(int64_t), "pool byte sizes must fit size_t");

// Bytes of one page and of one block, every product checked so that nothing overflows. Returns
// the field whose factor made a size overflow int64, or nullptr.
const char* checked_sizes(const CacheConfig& c, int64_t* page_bytes, int64_t* block_bytes) {
  const int64_t es = is_known(c.dtype) ? static_cast<int64_t>(dtype_size(c.dtype)) : 1;
  int64_t page = 0;
  if (__builtin_mul_overflow(int64_t{c.block_size}, int64_t{c.num_kv_heads}, &page)) {
    return "num_kv_heads";
  }
  if (__builtin_mul_overflow(page, int64_t{c.head_dim}, &page) ||
      __builtin_mul_overflow(page, es, &page)) {
    return "head_dim";
  }
  int64_t block = 0;
  if (__builtin_mul_overflow(page, parts_per_layer(c) * c.num_layers, &block)) return "num_layers";
  *page_bytes = page;
  *block_bytes = block;
  return nullptr;
}

}  // namespace

int64_t CacheConfig::page_bytes() const {
  int64_t page = -1, block = -1;
  return checked_sizes(*this, &page, &block) == nullptr ? page : -1;
}

int64_t CacheConfig::block_bytes() const {
  int64_t page = -1, block = -1;
  return checked_sizes(*this, &page, &block) == nullptr ? block : -1;
}

namespace {
// For exact products of a byte budget and a block count (both int64).
__extension__ using Wide = __int128;
}  // namespace

int64_t CacheConfig::blocks_per_sequence(int64_t context) const {
  const int64_t bs = block_size;
  const int64_t held = context / bs + 1;  // the blocks of context + 1 tokens
  if (sliding_window == 0) return held;
  return held - std::max<int64_t>(0, context - sliding_window) / bs;
}

StatusOr<CacheConfig> CacheConfig::with_pools(int64_t device_bytes, int64_t host_bytes,
                                              int64_t context) const {
  if (device_bytes < 0 || host_bytes < 0) {
    return invalid_argument("with_pools: budgets must be >= 0 bytes, got " +
                            std::to_string(device_bytes) + " device and " +
                            std::to_string(host_bytes) + " host");
  }
  if (context < 1) {
    return invalid_argument("with_pools: context must be >= 1 token, got " +
                            std::to_string(context));
  }
  if (block_size < 1) return invalid_argument("block_size: must be >= 1");
  CacheConfig c = *this;
  // What a sequence of `context` tokens holds in each group, in bytes: the shares of the budget.
  // Exact integer arithmetic, so a budget of n such sequences gives each group n of them.
  std::vector<int64_t> per_seq(static_cast<size_t>(num_groups()));
  std::vector<int64_t> block(per_seq.size());
  Wide total = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const CacheConfig gc = group_config(g);
    const size_t i = static_cast<size_t>(g);
    block[i] = gc.block_bytes();
    if (block[i] <= 0) {
      return invalid_argument(
          (groups.empty() ? std::string() : "groups[" + std::to_string(g) + "]: ") +
          "with_pools: the block bytes of this shape overflow or are 0");
    }
    if (gc.sliding_window < 0) {
      return invalid_argument(
          (groups.empty() ? std::string() : "groups[" + std::to_string(g) + "]: ") +
          "sliding_window: must be >= 0, got " + std::to_string(gc.sliding_window));
    }
    per_seq[i] = gc.blocks_per_sequence(context);  // >= 1: a window >= 0 keeps the next slot
    total += static_cast<Wide>(per_seq[i]) * block[i];
  }
  if (groups.empty()) {
    c.num_device_blocks = device_bytes / block[0];
    c.num_host_blocks = host_bytes / block[0];
    return c;
  }
  // Group g's share of `bytes`, in its blocks: bytes * (per_seq * block / total) / block.
  const auto blocks_of = [&](int64_t bytes, size_t g) {
    return static_cast<int64_t>(static_cast<Wide>(bytes) * per_seq[g] / total);
  };
  c.num_device_blocks = 0;
  c.num_host_blocks = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    KvGroup& k = c.groups[g];
    k.num_device_blocks = std::max<int64_t>(1, blocks_of(device_bytes, g));
    k.num_host_blocks = blocks_of(host_bytes, g);
    c.num_device_blocks += k.num_device_blocks;
    c.num_host_blocks += k.num_host_blocks;
  }
  return c;
}

std::vector<LayerGroup> CacheConfig::layer_groups() const {
  std::vector<LayerGroup> out(static_cast<size_t>(num_layers));
  if (groups.empty()) {
    for (int32_t l = 0; l < num_layers; ++l) out[static_cast<size_t>(l)] = {0, l};
    return out;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int32_t>& layers = groups[g].layers;
    for (size_t i = 0; i < layers.size(); ++i) {
      out[static_cast<size_t>(layers[i])] = {static_cast<int32_t>(g), static_cast<int32_t>(i)};
    }
  }
  return out;
}

StatusOr<LayerGroup> find_layer_group(const std::vector<LayerGroup>& layers, int32_t layer) {
  if (layer < 0 || static_cast<size_t>(layer) >= layers.size()) {
    return out_of_range("layer " + std::to_string(layer) + " outside the model's " +
                        std::to_string(layers.size()) + " layers");
  }
  return layers[static_cast<size_t>(layer)];
}

CacheConfig CacheConfig::group_config(int32_t g) const {
  CacheConfig c = *this;
  c.groups.clear();
  if (groups.empty()) return c;
  const KvGroup& k = groups[static_cast<size_t>(g)];
  c.num_layers = static_cast<int32_t>(k.layers.size());
  c.num_kv_heads = k.num_kv_heads;
  c.head_dim = k.head_dim;
  c.dtype = k.dtype;
  c.kv_kind = k.kv_kind;
  c.rope_dim = k.rope_dim;
  c.sliding_window = k.sliding_window;
  c.num_device_blocks = k.num_device_blocks;
  c.num_host_blocks = k.num_host_blocks;
  return c;
}

namespace {

// The model's layers each in exactly one group, and each group a valid one-group config.
Status validate_groups(const CacheConfig& c) {
  std::vector<int32_t> owner(static_cast<size_t>(c.num_layers), -1);
  for (int32_t g = 0; g < c.num_groups(); ++g) {
    const KvGroup& k = c.groups[static_cast<size_t>(g)];
    const std::string name = "groups[" + std::to_string(g) + "]" +
                             (k.name.empty() ? std::string() : " (" + k.name + ")");
    if (k.layers.empty()) return invalid_argument(name + ": layers: a group needs a layer");
    for (int32_t layer : k.layers) {
      if (layer < 0 || layer >= c.num_layers) {
        return invalid_argument(name + ": layers: layer " + std::to_string(layer) +
                                " is outside the model's " + std::to_string(c.num_layers) +
                                " layers");
      }
      int32_t& o = owner[static_cast<size_t>(layer)];
      if (o >= 0) {
        return invalid_argument(
            name + ": layers: layer " + std::to_string(layer) +
            (o == g ? " is listed twice" : " is in groups[" + std::to_string(o) + "] too"));
      }
      o = g;
    }
    const Status st = c.group_config(g).validate();
    if (!st.ok()) return invalid_argument(name + ": " + st.message());
  }
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    if (owner[static_cast<size_t>(layer)] < 0) {
      return invalid_argument("groups: layer " + std::to_string(layer) + " is in no group");
    }
  }
  return ok_status();
}

}  // namespace

Status CacheConfig::validate() const {
  if (!groups.empty()) {
    if (num_layers <= 0)
      return field_error("num_layers", "must be positive, got " + std::to_string(num_layers));
    if (mode != CacheMode::kPaged) return field_error("groups", "KV groups need paged mode");
    return validate_groups(*this);
  }
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  if (num_layers <= 0)
    return field_error("num_layers", "must be positive, got " + std::to_string(num_layers));
  if (num_kv_heads <= 0)
    return field_error("num_kv_heads", "must be positive, got " + std::to_string(num_kv_heads));
  if (head_dim <= 0)
    return field_error("head_dim", "must be positive, got " + std::to_string(head_dim));
  if (block_size <= 0)
    return field_error("block_size", "must be positive, got " + std::to_string(block_size));
  if (sliding_window != 0 && sliding_window < block_size) {
    return field_error("sliding_window", "must be 0 (full attention) or at least block_size (" +
                                             std::to_string(block_size) + "), got " +
                                             std::to_string(sliding_window));
  }
  if (sliding_window != 0 && mode == CacheMode::kDense) {
    return field_error("sliding_window", "needs paged mode");
  }
  if (num_device_blocks <= 0) {
    return field_error("num_device_blocks",
                       "must be positive, got " + std::to_string(num_device_blocks));
  }
  // Block ids are int32 in block tables and CSR indices.
  if (num_device_blocks > kMaxInt32) {
    return field_error("num_device_blocks", "exceeds the int32 block-id range");
  }
  if (num_host_blocks < 0) {
    return field_error("num_host_blocks",
                       "must be zero or positive, got " + std::to_string(num_host_blocks));
  }
  if (num_host_blocks > kMaxInt32)
    return field_error("num_host_blocks", "exceeds the int32 block-id range");
  if (!is_known(dtype)) return field_error("dtype", "unknown element type");
  if (page_layout != PageLayout::kNHD && page_layout != PageLayout::kHND) {
    return field_error("page_layout", "must be NHD or HND");
  }
  if (static_cast<int>(eviction_policy) > static_cast<int>(EvictionPolicy::kFifo)) {
    return field_error("eviction_policy", "must be none, lru or fifo");
  }
  if (static_cast<int>(backend) > static_cast<int>(BackendKind::kNull)) {
    return field_error("backend", "must be auto, cpu, cuda or null");
  }
  if (mode != CacheMode::kPaged && mode != CacheMode::kDense) {
    return field_error("mode", "must be paged or dense");
  }
  if (max_sequence_length <= 0) {
    return field_error("max_sequence_length",
                       "must be positive, got " + std::to_string(max_sequence_length));
  }
  if (dense_initial_length <= 0) {
    return field_error("dense_initial_length",
                       "must be positive, got " + std::to_string(dense_initial_length));
  }
  if (dense_max_free_buffers < 0) {
    return field_error("dense_max_free_buffers", "must be zero or positive");
  }
  if (kv_kind != KvKind::kKeyValue && kv_kind != KvKind::kLatent) {
    return field_error("kv_kind", "must be key-value or latent");
  }
  if (kv_kind == KvKind::kLatent) {
    if (num_kv_heads != 1) {
      return field_error("num_kv_heads",
                         "a latent (MLA) cache holds one latent vector per token: must be 1, got " +
                             std::to_string(num_kv_heads));
    }
    if (rope_dim <= 0 || rope_dim >= head_dim) {
      return field_error("rope_dim", "a latent (MLA) cache needs 0 < rope_dim < head_dim = " +
                                         std::to_string(head_dim) + ", got " +
                                         std::to_string(rope_dim));
    }
  } else if (rope_dim != 0) {
    return field_error("rope_dim", "only a latent (MLA) cache has a rope part: must be 0, got " +
                                       std::to_string(rope_dim));
  }
  // The kernels form int64 element and byte offsets into a pool, and its byte size is allocated
  // as a size_t: each pool's bytes, and every product on the way, must fit int64.
  int64_t page = 0, block = 0;
  if (const char* field = checked_sizes(*this, &page, &block)) {
    return field_error(field, "one block (num_layers * " + std::to_string(parts_per_layer(*this)) +
                                  " * block_size * num_kv_heads * head_dim * " +
                                  std::to_string(dtype_size(dtype)) +
                                  " bytes) overflows 64-bit byte offsets");
  }
  int64_t pool = 0;
  if (__builtin_mul_overflow(block, num_device_blocks, &pool)) {
    return field_error("num_device_blocks", std::to_string(num_device_blocks) + " blocks of " +
                                                std::to_string(block) +
                                                " bytes: the pool size overflows int64");
  }
  if (__builtin_mul_overflow(block, num_host_blocks, &pool)) {
    return field_error("num_host_blocks", std::to_string(num_host_blocks) + " blocks of " +
                                              std::to_string(block) +
                                              " bytes: the pool size overflows int64");
  }
  if (mode == CacheMode::kDense) {
    // A dense buffer grows to max_sequence_length positions of every layer, K and V (or latent).
    const int64_t position_bytes = block / block_size;
    if (__builtin_mul_overflow(position_bytes, int64_t{max_sequence_length}, &pool)) {
      return field_error("max_sequence_length",
                         "a dense buffer of " + std::to_string(max_sequence_length) +
                             " positions of " + std::to_string(position_bytes) +
                             " bytes overflows int64");
    }
  }
  return ok_status();
}

}  // namespace pagedkv
