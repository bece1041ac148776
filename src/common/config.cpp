#include "pagedkv/config.hpp"

#include <limits>
#include <string>

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
  }
  return "unknown";
}

namespace {

Status field_error(const char* field, const std::string& why) {
  return invalid_argument(std::string(field) + ": " + why);
}

bool is_known(DType t) { return static_cast<int>(t) < kNumDTypes; }

}  // namespace

int64_t CacheConfig::page_bytes() const {
  return static_cast<int64_t>(block_size) * num_kv_heads * head_dim *
         static_cast<int64_t>(dtype_size(dtype));
}

int64_t CacheConfig::block_bytes() const { return page_bytes() * 2 * num_layers; }

Status CacheConfig::validate() const {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  if (num_layers <= 0)
    return field_error("num_layers", "must be positive, got " + std::to_string(num_layers));
  if (num_kv_heads <= 0)
    return field_error("num_kv_heads", "must be positive, got " + std::to_string(num_kv_heads));
  if (head_dim <= 0)
    return field_error("head_dim", "must be positive, got " + std::to_string(head_dim));
  if (block_size <= 0)
    return field_error("block_size", "must be positive, got " + std::to_string(block_size));
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
  if (static_cast<int>(backend) > static_cast<int>(BackendKind::kCuda)) {
    return field_error("backend", "must be auto, cpu or cuda");
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
  // A slot (block * block_size + offset) is int64; a page's element offsets must fit comfortably
  // in int64 and a single block in the address space.
  const long double pool_elems = static_cast<long double>(num_device_blocks) * num_layers * 2 *
                                 block_size * num_kv_heads * head_dim;
  if (pool_elems > static_cast<long double>(std::numeric_limits<int64_t>::max() / 8)) {
    return field_error("num_device_blocks", "pool size overflows 64-bit offsets");
  }
  return ok_status();
}

}  // namespace pagedkv
