// KvCache's queries: where a sequence's tokens and blocks are, what it holds, the counters,
// events and invariants. None of them changes the cache.
#include <algorithm>
#include <string>
#include <vector>

#include "core/control_plane.hpp"
#include "pagedkv/cache.hpp"
#include "runtime/storage_link.hpp"
#include "runtime/upload_arena.hpp"

namespace pagedkv {

bool KvCache::contains(SequenceId id) const { return control_->contains(id); }

StatusOr<int64_t> KvCache::length(SequenceId id) const { return control_->length(id); }

StatusOr<int64_t> KvCache::pending(SequenceId id) const { return control_->pending(id); }

StatusOr<int64_t> KvCache::slot(SequenceId id, int64_t position) const {
  return control_->slot(id, position);
}

StatusOr<std::vector<BlockLocation>> KvCache::block_locations(SequenceId id) const {
  return control_->block_locations(id);
}

StatusOr<std::vector<int64_t>> KvCache::reserved_slots(SequenceId id, int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  std::vector<int64_t> out;
  PAGEDKV_RETURN_IF_ERROR(control_->group_reserved_slots(id, g, &out));
  return out;
}

StatusOr<std::vector<BlockLocation>> KvCache::block_locations(SequenceId id, int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  return control_->group_block_locations(id, g);
}

StatusOr<int64_t> KvCache::held_blocks(SequenceId id, int32_t g) const {
  PAGEDKV_ASSIGN_OR_RETURN(std::vector<BlockLocation> blocks, block_locations(id, g));
  return static_cast<int64_t>(std::count_if(blocks.begin(), blocks.end(),
                                            [](const BlockLocation& b) { return b.block >= 0; }));
}

StatusOr<int64_t> KvCache::held_bytes(SequenceId id) const {
  int64_t bytes = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t n, held_blocks(id, g));
    bytes += n * group_config(g).block_bytes();
  }
  return bytes;
}

ControlStats KvCache::stats() const {
  ControlStats st = control_->stats();
  if (storage_ != nullptr) storage_->add_stats(&st);
  return st;
}

StatusOr<ControlStats> KvCache::group_stats(int32_t g) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(g));
  ControlStats st = control_->group_stats(g, group_config(g).block_bytes());
  if (storage_ != nullptr) storage_->add_stats(&st, g);
  return st;
}

std::vector<ControlEvent> KvCache::drain_events() { return control_->drain_events(); }

Status KvCache::check_invariants() const {
  PAGEDKV_RETURN_IF_ERROR(control_->check_invariants());
  int64_t leases = 0;
  for (const auto& lease : batch_uploads_) leases += lease != nullptr && lease->held() ? 1 : 0;
  if (control_->plan_open()) return internal_error("a tier plan was left open");
  for (const GroupPool& g : groups_) {
    for (const auto& [id, upload] : g.slot_uploads) {
      if (!control_->contains(id)) {
        return internal_error("an upload of slots is kept for sequence " + std::to_string(id) +
                              ", which no longer exists");
      }
      leases += upload.lease != nullptr ? 1 : 0;
    }
  }
  // Every upload region still held belongs to the last batch or to a reservation's slots: a
  // call that leaked one would keep the arena from ever reusing its chunk.
  if (uploads_->live_leases() != leases) {
    return internal_error("the upload arena holds " + std::to_string(uploads_->live_leases()) +
                          " regions; the cache accounts for " + std::to_string(leases));
  }
  return ok_status();
}

}  // namespace pagedkv
