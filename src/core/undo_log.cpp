// The journal that lets a TierPlan be taken back: a tier-moving call (reserve, reserve_batch,
// offload, restore, prefetch) whose transfers the data plane failed to carry out. The call's
// revocable effects are recorded as they happen: allocations, releases and moves between tiers,
// each touched sequence's table, reservation and residency, and the references it dropped at its
// end. Undoing them in reverse order puts every block back into the slot it left: a slot
// vacated by a move or release can only have been taken by a later allocation or move of the
// same call, which is undone first.
// Evicting unreferenced cached blocks and dropping victims need no data and are not undone.
#include <cassert>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {

void ControlPlane::begin_journal() {
  journal_.begin(counters_, events_.next_sequence());
  if (report_host_drops_) {
    origins_.begin_call();
    groups_.begin_call();
  }
}

void ControlPlane::flush_deferred_releases() {
  for (const DeferredRelease& d : deferred_release_) {
    if (!groups_.empty()) groups_.drop(*d.owner, d.index, d.block, /*undoable=*/true);
    if (d.pages_only) continue;
    const BlockInfo& b = blocks_[d.block];
    journal_.released.push_back(Journal::Released{d.block, b.tier, b.phys});
    release_block(d.block, *d.owner);
  }
  deferred_release_.clear();
}

std::vector<BlockMove> ControlPlane::undo_plan(int64_t moves_done, std::vector<int32_t>* inverts) {
  std::vector<BlockMove> inverse;
  if (inverts != nullptr) inverts->clear();
  if (!journal_.open) return inverse;
  journal_.open = false;

  groups_.undo(moves_done, &inverse, inverts);
  // References dropped at the end of the call come back first (nothing reused their slots).
  for (auto it = journal_.released.rbegin(); it != journal_.released.rend(); ++it) {
    if (blocks_.live(it->block)) {
      BlockInfo& b = blocks_[it->block];
      if (b.ref++ == 0) {  // it had become a cached block
        unlist(it->block);
        tier(b.tier).remove_cached();
      }
    } else {
      blocks_.reacquire(it->block, it->tier, it->phys);
    }
  }

  for (auto it = journal_.ops.rbegin(); it != journal_.ops.rend(); ++it) {
    const LogicalId id = it->block;
    if (it->kind == Journal::OpKind::kAllocate) {
      BlockInfo& b = blocks_[id];
      assert(b.ref == 1 && b.node < 0);
      b.ref = 0;
      blocks_.release(id);
      continue;
    }
    if (it->kind == Journal::OpKind::kRelease) {
      blocks_.reacquire(id, it->from_tier, it->from_phys);
      continue;
    }
    if (it->kind == Journal::OpKind::kUnref) {
      ++blocks_[id].ref;
      continue;
    }
    // A demoted cached block may have been dropped from the host tier later in the call.
    if (!blocks_.live(id)) continue;
    const BlockInfo& b = blocks_[id];
    const Tier now_tier = b.tier;
    const int32_t now_phys = b.phys;
    if (it->move_index < moves_done) {
      inverse.push_back(BlockMove{now_tier, now_phys, it->from_tier, it->from_phys, full_group_});
      if (inverts != nullptr) inverts->push_back(it->move_index);
    }
    unlist(id);
    blocks_.move_to(id, it->from_tier, it->from_phys);
    after_tier_change(id, now_tier, /*announce=*/false);
  }

  for (const Journal::SavedSequence& saved : journal_.sequences) {
    Sequence* s = seqs_.find(saved.id);
    assert(s != nullptr);
    s->blocks.resize(saved.blocks - saved.tail_size);
    if (saved.cow_index >= 0) s->blocks[static_cast<size_t>(saved.cow_index)] = saved.cow_source;
    for (uint32_t i = saved.tail_size; i > 0; --i) {
      s->blocks.push_back(journal_.tails[saved.tail_begin + i - 1]);
    }
    s->pending = saved.pending;
    s->offloaded = saved.offloaded;
    s->last_used = saved.last_used;
    s->mark_changed(0);
    update_victim(s);
  }

  // Counters and events of what was undone go; evictions and drops stay. The call's events are
  // named by sequence number, which stays right when the ring dropped older ones (or some of the
  // call's own) on overflow; a drop marker stays, as the dropped events cannot come back.
  const ControlStats now = counters_;
  counters_ = journal_.counters;
  counters_.blocks_evicted = now.blocks_evicted;
  counters_.sequences_evicted = now.sequences_evicted;
  counters_.host_blocks_dropped = now.host_blocks_dropped;
  events_.erase_revocable_since(journal_.first_event);
  return inverse;
}

}  // namespace core
}  // namespace pagedkv
