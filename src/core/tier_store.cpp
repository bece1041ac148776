#include "core/tier_store.hpp"

namespace pagedkv {
namespace core {

std::vector<TierSpec> tier_specs(const CacheConfig& config) {
  TierSpec device;
  device.tier = Tier::kDevice;
  device.name = "device";
  device.demotes = config.cache_prefixes_on_host && config.num_host_blocks > 0;
  device.demote_to = Tier::kHost;
  TierSpec host;
  host.tier = Tier::kHost;
  host.name = "host";
  host.last = true;
  return {device, host};
}

TierStats TierStore::stats(int64_t block_bytes) const {
  TierStats x;
  x.total_blocks = total_blocks();
  x.free_blocks = free_blocks();
  x.cached_blocks = cached_;
  x.used_blocks = x.total_blocks - x.free_blocks - x.cached_blocks;
  x.total_bytes = x.total_blocks * block_bytes;
  x.used_bytes = (x.total_blocks - x.free_blocks) * block_bytes;
  return x;
}

Status TierStore::check(int64_t cached_recount, int64_t listed_recount,
                        int64_t used_recount) const {
  const std::string tier = std::string(spec_.name) + " tier: ";
  if (cached_recount != cached_) {
    return internal_error(tier + "cached count " + std::to_string(cached_) + " but " +
                          std::to_string(cached_recount) + " recounted");
  }
  if (listed_recount != queue_.size()) {
    return internal_error(tier + "eviction queue holds " + std::to_string(queue_.size()) +
                          " blocks but " + std::to_string(listed_recount) + " are listed");
  }
  if (free_blocks() + cached_recount + used_recount != total_blocks()) {
    return internal_error(tier + "free " + std::to_string(free_blocks()) + " + cached " +
                          std::to_string(cached_recount) + " + used " +
                          std::to_string(used_recount) + " != total " +
                          std::to_string(total_blocks()));
  }
  return ok_status();
}

}  // namespace core
}  // namespace pagedkv
