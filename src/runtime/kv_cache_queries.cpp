// KvCache's queries: where a sequence's tokens and blocks are, what it holds, the counters,
// events and invariants. None of them changes the cache.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/kv_cache_impl.hpp"

namespace pagedkv {

bool KvCache::contains(SequenceId id) const { return impl_->control->contains(id); }

StatusOr<int64_t> KvCache::length(SequenceId id) const { return impl_->control->length(id); }

StatusOr<int64_t> KvCache::pending(SequenceId id) const { return impl_->control->pending(id); }

StatusOr<int64_t> KvCache::slot(SequenceId id, int64_t position) const {
  return impl_->control->slot(id, position);
}

StatusOr<std::vector<BlockLocation>> KvCache::block_locations(SequenceId id) const {
  return impl_->control->block_locations(id);
}

StatusOr<std::vector<int64_t>> KvCache::reserved_slots(SequenceId id, int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(impl_->check_group(g));
  std::vector<int64_t> out;
  PAGEDKV_RETURN_IF_ERROR(impl_->control->group_reserved_slots(id, g, &out));
  return out;
}

StatusOr<std::vector<BlockLocation>> KvCache::block_locations(SequenceId id, int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(impl_->check_group(g));
  return impl_->control->group_block_locations(id, g);
}

StatusOr<int64_t> KvCache::held_blocks(SequenceId id, int32_t g) const {
  PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, block_locations(id, g));
  return static_cast<int64_t>(std::count_if(blocks.begin(), blocks.end(),
                                            [](const BlockLocation& b) { return b.block >= 0; }));
}

StatusOr<int64_t> KvCache::held_bytes(SequenceId id) const {
  int64_t bytes = 0;
  for (int32_t g = 0; g < impl_->num_groups(); ++g) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t n, held_blocks(id, g));
    bytes += n * impl_->group_block_bytes(g);
  }
  return bytes;
}

ControlStats KvCache::stats() const {
  ControlStats st = impl_->control->stats();
  if (impl_->storage != nullptr) impl_->storage->add_stats(&st);
  return st;
}

StatusOr<ControlStats> KvCache::group_stats(int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(impl_->check_group(g));
  ControlStats st = impl_->control->group_stats(g, impl_->group_block_bytes(g));
  if (impl_->storage != nullptr) impl_->storage->add_stats(&st, g);
  return st;
}

std::vector<ControlEvent> KvCache::drain_events() { return impl_->control->drain_events(); }

Status KvCache::check_invariants() const {
  PAGEDKV_RETURN_IF_ERROR(impl_->control->check_invariants());
  if (impl_->control->plan_open()) return internal_error("a tier plan was left open");
  int64_t batch_leases = 0;  // in the batch arena, or in rank 0's without one
  for (const auto& lease : impl_->batch_uploads) batch_leases += lease != nullptr && lease->held();
  if (impl_->batch_arena != nullptr && impl_->batch_arena->live_leases() != batch_leases) {
    return internal_error("the batch upload arena holds " +
                          std::to_string(impl_->batch_arena->live_leases()) +
                          " regions; the cache accounts for " + std::to_string(batch_leases));
  }
  for (size_t r = 0; r < impl_->ranks.size(); ++r) {
    const KvCache::Impl::Rank& rank = impl_->ranks[r];
    int64_t leases = r == 0 && impl_->batch_arena == nullptr ? batch_leases : 0;
    for (const auto& g : rank.groups) {
      for (const auto& [id, upload] : g.slot_uploads) {
        if (!impl_->control->contains(id)) {
          return internal_error("an upload of slots is kept for sequence " + std::to_string(id) +
                                ", which no longer exists");
        }
        leases += upload.lease != nullptr ? 1 : 0;
      }
    }
    // Every upload region still held belongs to the last batch or to a reservation's slots: a
    // call that leaked one would keep the arena from ever reusing its chunk.
    if (rank.uploads->live_leases() != leases) {
      return internal_error("rank " + std::to_string(r) + "'s upload arena holds " +
                            std::to_string(rank.uploads->live_leases()) +
                            " regions; the cache accounts for " + std::to_string(leases));
    }
  }
  return ok_status();
}

}  // namespace pagedkv
