// The tiers' cached blocks (one TierStore each, from the tier table) and the moves between
// them. A cached (registered, unreferenced) device block is listed for eviction once no child of it
// is device-resident; evicting it demotes it to the host tier when a host slot is free or can be
// had by dropping the least recently used cached host leaf, and drops it otherwise. A prefix hit on
// a host-resident block makes the new sequence "offloaded" until its first reserve (or a
// restore/prefetch) brings the blocks back, in the same transfer job as the step's other moves.
#include <cassert>
#include <string>

#include "core/control_plane.hpp"
#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

void ControlPlane::list_if_evictable(LogicalId id) {
  const BlockInfo& b = blocks_[id];
  if (b.listed || b.ref != 0 || b.node < 0) return;
  const bool leaf =
      tier(b.tier).spec().last ? index_.node(b.node).children == 0 : b.device_children == 0;
  if (leaf) tier(b.tier).queue().push(id);
}

void ControlPlane::move_block(LogicalId id, Tier dst, Transfers* out) {
  if (blocks_[id].listed) tier(blocks_[id].tier).queue().erase(id);
  BlockMove m = blocks_.move(id, dst);
  m.group = full_group_;
  journal_.move(id, m, out->moves.size());
  if (report_host_drops_) origins_.record(m);
  out->moves.push_back(m);
  after_tier_change(id, m.src_tier);
  if (!groups_.empty()) groups_.move(id, m.src_tier, dst, out);
}

void ControlPlane::after_tier_change(LogicalId id, Tier from, bool announce) {
  const BlockInfo& b = blocks_[id];
  if (b.node < 0) return;
  // Routers track a cached block per tier: stored where it is now, then gone from where it was.
  // Both are taken back with the call if it is undone.
  if (announce) {
    emit_block_event(EventKind::kBlockStored, b.node, b.tier, /*revocable=*/true);
    emit_block_event(EventKind::kBlockRemoved, b.node, from, /*revocable=*/true);
  }
  const NodeId parent = index_.node(b.node).parent;
  if (parent != kRootNode) {
    const LogicalId pid = index_.node(parent).block;
    BlockInfo& p = blocks_[pid];
    if (b.tier == Tier::kDevice) {
      if (p.device_children++ == 0 && p.listed && p.tier == Tier::kDevice)
        tier(Tier::kDevice).queue().erase(pid);
    } else if (--p.device_children == 0) {
      list_if_evictable(pid);
    }
  }
  if (b.ref == 0) {
    tier(from).remove_cached();
    tier(b.tier).add_cached();
    tier(b.tier).queue().schedule_expiry(id);
    list_if_evictable(id);
  }
}

bool ControlPlane::drop_lru(Tier t, Transfers* out) {
  TierStore& store = tier(t);
  if (store.queue().has_deadlines()) store.queue().expire(now_ns());
  const LogicalId id = store.queue().front();
  if (id == kNoBlock) return false;
  store.queue().erase(id);
  store.remove_cached();
  if (report_host_drops_ && t == Tier::kHost) {
    // Write-back: the bytes are where they were when this call began until its moves run (a
    // block demoted earlier in the call is still in its device block).
    const PrefixNode& x = index_.node(blocks_[id].node);
    const TokenId* tokens = index_.tokens(blocks_[id].node);
    const BlockLocation source =
        journal_.open ? origins_.origin(t, blocks_[id].phys) : BlockLocation{t, blocks_[id].phys};
    out->host_drops.push_back(DroppedBlock{x.hash, x.parent_hash, x.ns, source,
                                           std::vector<TokenId>(tokens, tokens + block_size_),
                                           full_group_});
    // Every other group's page of it (a cached page is on its block's tier), from its origin.
    for (size_t w = 0; w < groups_.size(); ++w) {
      const int32_t page = groups_[w].page(id);
      if (page < 0) continue;
      DroppedBlock d = out->host_drops.back();
      d.group = groups_[w].config_index();
      d.source = journal_.open ? groups_.origins(w).origin(t, page) : BlockLocation{t, page};
      out->host_drops.push_back(std::move(d));
    }
  }
  remove_node(blocks_[id].node);
  release_logical(id);
  ++counters_.host_blocks_dropped;
  return true;
}

void ControlPlane::make_room(Tier t, int64_t n, Transfers* out) {
  while (tier(t).free_blocks() < n) {
    if (drop_lru(t, out)) continue;
    // Every cached block left here has a device-resident descendant (a chain whose head was
    // offloaded after a rollback left its tail cached on the device): drop device cached
    // blocks until one of those becomes a leaf here.
    if (!drop_device_cached()) {
      assert(false && "make_room: the room was overcounted");
      return;
    }
  }
}

bool ControlPlane::drop_device_cached() {
  TierStore& device = tier(Tier::kDevice);
  if (device.queue().has_deadlines()) device.queue().expire(now_ns());
  for (LogicalId id = device.queue().front(); id != kNoBlock; id = device.queue().front()) {
    device.queue().erase(id);
    if (index_.node(blocks_[id].node).children != 0) {
      parked_.push_back(id);  // its children are in the tier below: they go first
      continue;
    }
    device.remove_cached();
    remove_node(blocks_[id].node);
    release_logical(id);
    ++counters_.blocks_evicted;
    return true;
  }
  return false;
}

void ControlPlane::relist_parked() {
  for (LogicalId id : parked_) {
    if (blocks_.live(id) && blocks_[id].tier == Tier::kDevice) list_if_evictable(id);
  }
  parked_.clear();
}

void ControlPlane::evict_one(Transfers* out) {
  TierStore& device = tier(Tier::kDevice);
  const TierSpec& spec = device.spec();
  const TierStore& below = tier(spec.demote_to);
  // Expired retention priorities are applied lazily, only when a victim is chosen.
  if (device.queue().has_deadlines()) device.queue().expire(now_ns());
  if (spec.demotes && !parked_.empty() && below.slot_at_hand()) relist_parked();
  while (true) {
    const LogicalId id = device.queue().front();
    if (id == kNoBlock) {
      // Only parked blocks are left (the planner counts them): dropping cached leaves below
      // either makes room to demote them or, leaf by leaf, frees them of their children.
      const bool room = spec.demotes && below.slot_at_hand();
      if (parked_.empty() || (!room && !drop_lru(Tier::kHost, out))) {
        assert(false && "evict_one: nothing evictable; the planner promised too much");
        return;
      }
      relist_parked();
      continue;
    }
    prefetch_victims_after(id);
    device.queue().erase(id);
    if (spec.demotes && below.slot_at_hand()) {
      make_room(spec.demote_to, 1, out);
      move_block(id, spec.demote_to, out);
      ++counters_.blocks_demoted;
      return;
    }
    if (index_.node(blocks_[id].node).children != 0) {
      // Its children are all in the tier below and there is no room there to join them: it
      // waits until they are gone (remove_node lists it again) or room appears.
      parked_.push_back(id);
      continue;
    }
    device.remove_cached();
    remove_node(blocks_[id].node);
    release_logical(id);
    ++counters_.blocks_evicted;
    return;
  }
}

void ControlPlane::prefetch_victims_after(LogicalId victim) const {
  // An eviction's time is its cache misses: the block record, the prefix node and the hash slot
  // of the victim, each needed before the next can be found. So each eviction prefetches what
  // the next ones will read, from lines an earlier eviction fetched: along the victim's parents
  // when the parent is next (a chain released together goes leaf first, then up), else along the
  // queue's list (the slot of the victim listed next, the node of the one after, the record of
  // the one after that).
  if (prefetch_parents_of(victim)) return;
  const EvictionQueue& queue = tier(Tier::kDevice).queue();
  const LogicalId v2 = queue.next_in_list(victim);
  if (v2 == kNoBlock) return;
  const LogicalId v3 = queue.next_in_list(v2);
  if (blocks_[v2].node >= 0) index_.prefetch_slot(blocks_[v2].node);
  if (v3 == kNoBlock) return;
  if (blocks_[v3].node >= 0) index_.prefetch_node(blocks_[v3].node);
  const LogicalId v4 = queue.next_in_list(v3);
  if (v4 != kNoBlock) __builtin_prefetch(&blocks_[v4]);
}

bool ControlPlane::prefetch_parents_of(LogicalId victim) const {
  const NodeId node = blocks_[victim].node;
  if (node < 0) return false;
  const NodeId parent = index_.node(node).parent;
  if (parent == kRootNode) return false;
  // The parent's node and record are read by this eviction anyway (its children counts).
  const PrefixNode& p = index_.node(parent);
  const BlockInfo& pb = blocks_[p.block];
  if (pb.ref != 0 || pb.tier != Tier::kDevice || pb.device_children != 1) return false;
  // The parent becomes evictable: its slot is what evicting it will miss on; the grandparent's
  // record and the node above it are what the eviction after that reads first.
  index_.prefetch_slot(parent);
  if (p.parent == kRootNode) return true;
  const PrefixNode& g = index_.node(p.parent);
  __builtin_prefetch(&blocks_[g.block]);
  if (g.parent != kRootNode) index_.prefetch_node(g.parent);
  return true;
}

LogicalId ControlPlane::take_device_block(Transfers* out) {
  if (blocks_.free_count(Tier::kDevice) == 0) evict_one(out);
  const LogicalId id = blocks_.allocate(Tier::kDevice);
  journal_.allocation(id);
  if (!groups_.empty()) groups_.take(id);
  return id;
}

void ControlPlane::do_offload(Sequence* s, Transfers* out) {
  journal_.sequence(*s);
  make_room(Tier::kHost, exclusive_device_blocks(*s), out);
  int64_t moved = 0;
  for (LogicalId b : s->live_blocks()) {
    const BlockInfo& info = blocks_[b];
    if (info.ref != 1 || info.tier != Tier::kDevice) continue;
    move_block(b, Tier::kHost, out);
    ++moved;
  }
  s->offloaded = true;
  s->mark_changed(0);  // every block may have moved
  seqs_.clear_victim(s);
  out->offloaded.push_back(s->id);
  ++counters_.sequences_offloaded;
  ++counters_.offloaded_sequences;
  counters_.blocks_offloaded += moved;
  emit_sequence_event(EventKind::kSequenceOffloaded, s->id, /*revocable=*/true);
}

void ControlPlane::do_restore(Sequence* s, Transfers* out) {
  journal_.sequence(*s);
  int64_t moved = 0;
  for (LogicalId b : s->live_blocks()) {
    if (blocks_[b].tier != Tier::kHost) continue;
    if (blocks_.free_count(Tier::kDevice) == 0) evict_one(out);
    move_block(b, Tier::kDevice, out);
    ++moved;
  }
  s->offloaded = false;
  s->mark_changed(0);  // every block may have moved
  update_victim(s);
  out->restored.push_back(s->id);
  ++counters_.sequences_restored;
  --counters_.offloaded_sequences;
  counters_.blocks_restored += moved;
  emit_sequence_event(EventKind::kSequenceRestored, s->id, /*revocable=*/true);
}

Status ControlPlane::run_offload(SequenceId id, Transfers* out) {
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  // Without a host tier nothing can move: an "offloaded" sequence whose blocks all stayed on the
  // device (empty, or every block shared) would be refused by build_batch yet read by gathers.
  if (config_.num_host_blocks == 0) {
    return failed_precondition("offload: " + seq_name(id) +
                               ": there is no host tier: num_host_blocks is 0");
  }
  if (s->active) return failed_precondition("offload: " + seq_name(id) + " is active");
  if (s->offloaded) return failed_precondition("offload: " + seq_name(id) + " is offloaded");
  const int64_t e = exclusive_device_blocks(*s);
  if (e > tier(Tier::kHost).room()) {
    return resource_exhausted("offload: " + seq_name(id) + " needs " + std::to_string(e) +
                              " host blocks, " + std::to_string(tier(Tier::kHost).room()) +
                              " free or held by cached blocks");
  }
  for (size_t w = 0; w < groups_.size(); ++w) {
    const int64_t pages = groups_.offload_pages(*s, w);
    const GroupPages& g = groups_[w];
    if (pages > g.room(Tier::kHost)) {
      return resource_exhausted("offload: " + seq_name(id) + " needs " + std::to_string(pages) +
                                " host pages in group " + std::to_string(g.config_index()) + ", " +
                                std::to_string(g.room(Tier::kHost)) +
                                " free or held by cached pages");
    }
  }
  begin_journal();
  do_offload(s, out);
  return ok_status();
}

Status ControlPlane::run_restore(SequenceId id, Transfers* out) {
  Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (!s->offloaded) return failed_precondition("restore: " + seq_name(id) + " is not offloaded");
  int64_t host_blocks = 0;
  for (LogicalId b : s->live_blocks()) host_blocks += blocks_[b].tier == Tier::kHost ? 1 : 0;
  VictimPlan plan;
  PAGEDKV_RETURN_IF_ERROR(plan_device_blocks(host_blocks, s, &plan));
  if (!groups_.empty()) {
    std::vector<int64_t> pages(groups_.size());
    for (size_t w = 0; w < groups_.size(); ++w) pages[w] = groups_.restore_pages(*s, w);
    PAGEDKV_RETURN_IF_ERROR(plan_group_pages(pages, s, &plan));
  }
  begin_journal();
  apply_plan(plan, out);
  do_restore(s, out);
  return ok_status();
}

Status ControlPlane::run_prefetch(const std::vector<SequenceId>& ids, Transfers* out) {
  for (SequenceId id : ids) {
    if (seqs_.find(id) == nullptr) return unknown(id);
  }
  begin_journal();
  for (SequenceId id : ids) {
    Sequence* s = seqs_.find(id);
    if (!s->offloaded) continue;
    int64_t host_blocks = 0;
    for (LogicalId b : s->live_blocks()) host_blocks += blocks_[b].tier == Tier::kHost ? 1 : 0;
    if (host_blocks > device_available()) continue;
    bool pages_fit = true;
    for (size_t w = 0; w < groups_.size(); ++w) {
      pages_fit = pages_fit && groups_.restore_pages(*s, w) <= groups_[w].room();
    }
    if (!pages_fit) continue;
    do_restore(s, out);
  }
  return ok_status();
}

}  // namespace core
}  // namespace pagedkv
