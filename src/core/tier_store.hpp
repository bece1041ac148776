// TierStore: one tier's share of the control plane, built from a row of the tier table
// (tier_specs()). It holds what the other tiers never touch: the count of the tier's cached
// blocks that no sequence references, and the eviction queue they leave by; its slots live in
// the shared BlockAllocator. The coordinator keeps one TierStore per tier, so the code that
// moves blocks between tiers names tiers through their specs instead of through members.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/eviction_queue.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

/// How the control plane uses one tier.
struct TierSpec {
  Tier tier = Tier::kDevice;
  /// Names the tier in messages and invariant reports.
  const char* name = "device";
  /// An evicted cached block of this tier moves to `demote_to` (when that tier can take it)
  /// instead of being dropped.
  bool demotes = false;
  Tier demote_to = Tier::kDevice;
  /// The last tier: a cached block here is a leaf (listed for eviction) only once it has no
  /// child at all, as dropping it would cut its children off the prefix index. In a tier that
  /// demotes, only children in the tier itself hold a block back (the device counts them in
  /// BlockInfo::device_children).
  bool last = false;
};

/// The tier table of a configuration: the device tier, then the host tier (its cached blocks
/// are demoted to the host when config.cache_prefixes_on_host and the host tier has blocks).
std::vector<TierSpec> tier_specs(const CacheConfig& config);

/// One tier's cached blocks and eviction queue (see the file comment).
class TierStore {
 public:
  /// `blocks` must outlive the store.
  TierStore(BlockAllocator* blocks, const TierSpec& spec)
      : spec_(spec), blocks_(blocks), queue_(blocks, spec.tier) {}

  const TierSpec& spec() const { return spec_; }
  Tier tier() const { return spec_.tier; }
  EvictionQueue& queue() { return queue_; }
  const EvictionQueue& queue() const { return queue_; }

  int64_t total_blocks() const { return blocks_->capacity(spec_.tier); }
  int64_t free_blocks() const { return blocks_->free_count(spec_.tier); }
  /// Registered blocks of this tier that no sequence references (all evictable, leaves first).
  int64_t cached_blocks() const { return cached_; }
  /// A registered block of this tier lost its last reference, or arrived unreferenced.
  void add_cached() { ++cached_; }
  /// A cached block of this tier was referenced again, left the tier or was dropped.
  void remove_cached() { --cached_; }
  /// Slots free or held by cached blocks.
  int64_t room() const { return free_blocks() + cached_; }
  /// Whether a slot is free, or a listed cached leaf can be dropped for one at once.
  bool slot_at_hand() const { return free_blocks() > 0 || queue_.size() > 0; }

  /// The tier's block counts as ControlStats reports them.
  TierStats stats(int64_t block_bytes) const;
  /// The store's own invariants against a recount of the tier's cached and listed blocks
  /// (kInternal naming the first one broken): the cached count, the queue's size, and
  /// free + cached + used == total.
  Status check(int64_t cached_recount, int64_t listed_recount, int64_t used_recount) const;

 private:
  TierSpec spec_;
  BlockAllocator* blocks_;
  EvictionQueue queue_;
  int64_t cached_ = 0;
};

}  // namespace core
}  // namespace pagedkv
