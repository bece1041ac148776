// The coordinator: construction, the block bookkeeping the parts share (references, the prefix
// index's nodes, events, victims), and the read-only queries. The calls themselves live in
// sequences.cpp, reserve.cpp, tiers.cpp and plans.cpp; the undo journal in undo_log.cpp.
#include "core/control_plane.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <string>

#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

namespace {

int64_t default_clock() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StatusOr<std::unique_ptr<ControlPlane>> ControlPlane::create(const CacheConfig& config,
                                                             ControlOptions options) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (config.mode != CacheMode::kPaged) {
    return invalid_argument("mode: ControlPlane is the paged control plane; use DenseAllocator");
  }
  if (options.event_capacity == 0) {
    return invalid_argument("event_capacity must be >= 1 (set enable_events = false for none)");
  }
  if (config.groups.empty()) {
    return std::unique_ptr<ControlPlane>(new ControlPlane(config, std::move(options)));
  }
  int32_t full = -1;
  PAGEDKV_RETURN_IF_ERROR(SharedGroups::check_config(config, &full));
  auto cp = std::unique_ptr<ControlPlane>(
      new ControlPlane(config.group_config(full), std::move(options)));
  cp->num_groups_ = static_cast<int32_t>(config.groups.size());
  cp->full_group_ = full;
  ControlPlane* plane = cp.get();
  cp->groups_ = SharedGroups(
      config, full, &cp->blocks_, &cp->journal_,
      [plane](EventKind kind, LogicalId b, const GroupPages& g, Tier tier, bool revocable) {
        plane->emit_page_event(kind, b, g, tier, revocable);
      },
      cp->report_host_drops_);
  for (size_t w = 0; w < cp->groups_.size(); ++w) cp->group_batch_.emplace_back(config.block_size);
  return cp;
}

ControlPlane::ControlPlane(const CacheConfig& config, ControlOptions options)
    : config_(config),
      clock_(options.clock ? std::move(options.clock) : Clock(default_clock)),
      events_enabled_(options.enable_events),
      report_host_drops_(options.report_host_drops),
      block_size_(config.block_size),
      window_(config.sliding_window),
      bdiv_(config.block_size),
      blocks_(config.num_device_blocks, config.num_host_blocks),
      index_(config.block_size, config.num_device_blocks + config.num_host_blocks),
      batch_(config.block_size),
      events_(options.event_capacity) {
  const std::vector<TierSpec> specs = tier_specs(config);
  tiers_.reserve(specs.size());
  for (const TierSpec& spec : specs) tiers_.emplace_back(&blocks_, spec);
  if (report_host_drops_) origins_.resize(config.num_device_blocks, config.num_host_blocks);
}

Status ControlPlane::validate_options(const SequenceOptions& o) const {
  if (o.retention_priority < kMinRetentionPriority ||
      o.retention_priority > kMaxRetentionPriority) {
    return invalid_argument("retention_priority must be in [0, 100], got " +
                            std::to_string(o.retention_priority));
  }
  if (o.retention_duration_ns < 0) return invalid_argument("retention_duration_ns must be >= 0");
  return ok_status();
}

// ---------------------------------------------------------------- block bookkeeping

void ControlPlane::unlist(LogicalId id) {
  if (blocks_[id].listed) tier(blocks_[id].tier).queue().erase(id);
}

void ControlPlane::release_block(LogicalId id, const Sequence& owner) {
  BlockInfo& b = blocks_[id];
  if (--b.ref > 0) return;
  b.last_access = ++tick_;
  if (b.node < 0) {
    release_logical(id);
    return;
  }
  // A registered block stays cached in its tier for later prompts.
  tier(b.tier).add_cached();
  b.retention = owner.options.retention_priority;
  b.expiry_ns =
      owner.options.retention_duration_ns > 0 ? now_ns() + owner.options.retention_duration_ns : 0;
  tier(b.tier).queue().schedule_expiry(id);
  list_if_evictable(id);
}

void ControlPlane::release_logical(LogicalId id) {
  groups_.release(id, blocks_[id].tier);
  blocks_.release(id);
}

void ControlPlane::release_tail(Sequence* s, size_t keep) {
  for (size_t i = s->blocks.size(); i > std::max(keep, s->first_live); --i) {
    if (!groups_.empty()) groups_.drop(*s, i - 1, s->blocks[i - 1]);
    release_block(s->blocks[i - 1], *s);
  }
  if (s->blocks.size() > keep) {
    s->blocks.resize(keep);
    s->mark_changed(keep);
  }
  s->first_live = std::min(s->first_live, keep);
  groups_.clamp_first_held(s, keep);
}

void ControlPlane::trim_window(Sequence* s) {
  const size_t first = window_first_block(s->length());
  if (first <= s->first_live) return;
  for (size_t i = s->first_live; i < first; ++i) {
    release_block(s->blocks[i], *s);
    s->blocks[i] = kNoBlock;
  }
  counters_.window_released_blocks += static_cast<int64_t>(first - s->first_live);
  // No new table version: the entries after `first` are unchanged, and a batch row clears the
  // trimmed ones by the first_live it was written with (batch_metadata.cpp).
  s->first_live = first;
}

void ControlPlane::remove_node(NodeId node) {
  const PrefixNode& x = index_.node(node);
  const LogicalId id = x.block;
  const NodeId parent = x.parent;
  emit_block_event(EventKind::kBlockRemoved, node);
  for (const GroupPages& g : groups_) {
    if (g.page(id) >= 0) emit_page_event(EventKind::kBlockRemoved, id, g, blocks_[id].tier);
  }
  if (parent != kRootNode && blocks_[id].tier == Tier::kDevice) {
    --blocks_[index_.node(parent).block].device_children;
  }
  index_.remove(node);
  blocks_[id].node = -1;
  // The parent may now be a leaf (host) or free of device children (device): evictable.
  if (parent != kRootNode) list_if_evictable(index_.node(parent).block);
}

void ControlPlane::register_full_block(Sequence* s, size_t i, const KeyHash* ahead) {
  const LogicalId ours = s->blocks[i];
  if (blocks_[ours].node >= 0) return;
  // A window keeps the block before the one it fills; the chain is broken where that block is
  // not indexed (see dedupe on the host tier below).
  NodeId parent = kRootNode;
  if (!key_parent(*s, i, &parent)) return;
  const NamespaceId ns = s->options.ns;
  const TokenId* tokens = &s->tokens[i * static_cast<size_t>(block_size_)];
  // A window cache keeps flat nodes (prefix_index.hpp): keyed by the prefix's hash, no parent.
  // One hash and one probe of the map, whether the block is new or found (the insert reuses
  // the lookup's).
  const uint64_t parent_hash = index_.prefix_hash(parent, ns);
  const uint64_t hash = ahead != nullptr && ahead->parent_hash == parent_hash
                            ? ahead->hash
                            : index_.chain_hash(parent_hash, tokens);
  const PrefixIndex::Lookup at =
      index_.lookup_known(window_ > 0 ? kRootNode : parent, parent_hash, hash, ns, tokens);
  const NodeId existing = at.found;
  if (existing < 0) {
    blocks_[ours].node = index_.insert(at, ours);
    if (window_ == 0 && parent != kRootNode) ++blocks_[index_.node(parent).block].device_children;
    emit_block_event(EventKind::kBlockStored, blocks_[ours].node);
    for (const GroupPages& g : groups_) {
      if (g.page(ours) >= 0) emit_page_event(EventKind::kBlockStored, ours, g);
    }
    return;
  }
  const LogicalId theirs = index_.node(existing).block;
  // The same prefix was computed elsewhere. On the device: use the cached block and free ours
  // (same tokens, same keys and values), so the index keeps one block per prefix. On the host:
  // keep ours unregistered; the offloaded copy stays the registered one.
  if (blocks_[theirs].tier != Tier::kDevice) return;
  // Likewise when a window group evicted the cached block's page and ours is shared.
  if (!groups_.empty() && !groups_.can_swap(*s, i, ours, theirs)) return;
  BlockInfo& t = blocks_[theirs];
  if (t.ref++ == 0) {
    tier(Tier::kDevice).remove_cached();
    unlist(theirs);
  }
  t.last_access = ++tick_;
  s->blocks[i] = theirs;
  s->mark_changed(i);
  if (!groups_.empty()) groups_.swap(*s, i, ours, theirs);
  release_block(ours, *s);
}

void ControlPlane::emit_block_event(EventKind kind, NodeId node, Tier tier, bool revocable,
                                    int32_t group) {
  if (!events_enabled_) return;
  const PrefixNode& x = index_.node(node);
  ControlEvent e;
  e.kind = kind;
  e.tier = tier;
  e.group = group < 0 ? full_group_ : group;
  e.block_hash = x.hash;
  e.parent_hash = x.parent_hash;
  e.ns = x.ns;
  if (kind == EventKind::kBlockStored) {
    const TokenId* t = index_.tokens(node);
    e.tokens.assign(t, t + block_size_);
  }
  events_.push(std::move(e), revocable);
}

void ControlPlane::emit_page_event(EventKind kind, LogicalId b, const GroupPages& g, Tier tier,
                                   bool revocable) {
  if (!events_enabled_) return;  // before reading the block: an eviction's record is cold
  emit_block_event(kind, blocks_[b].node, tier, revocable, g.config_index());
}

void ControlPlane::emit_sequence_event(EventKind kind, SequenceId id, bool revocable) {
  if (!events_enabled_) return;
  ControlEvent e;
  e.kind = kind;
  e.sequence = id;
  e.group = full_group_;
  events_.push(std::move(e), revocable);
}

void ControlPlane::update_victim(Sequence* s) {
  if (s->active || s->offloaded) {
    seqs_.clear_victim(s);
    return;
  }
  const uint64_t order =
      config_.eviction_policy == EvictionPolicy::kFifo ? s->arrival : s->last_used;
  seqs_.set_victim(s, SequenceTable::VictimKey(s->options.priority, order, s->id));
}

StatusOr<Residency> ControlPlane::residency(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  Residency r;
  for (LogicalId b : s->live_blocks()) {
    if (blocks_[b].tier == Tier::kDevice) {
      ++r.device_blocks;
    } else {
      ++r.host_blocks;
    }
  }
  r.offloaded = s->offloaded;
  return r;
}

// ---------------------------------------------------------------- queries

StatusOr<std::vector<BlockLocation>> ControlPlane::block_locations(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  std::vector<BlockLocation> out;
  out.reserve(s->blocks.size());
  for (LogicalId b : s->blocks) {
    // Out of the window: no block (kNoBlock), reported on the device tier.
    out.push_back(b == kNoBlock ? BlockLocation{Tier::kDevice, -1}
                                : BlockLocation{blocks_[b].tier, blocks_[b].phys});
  }
  return out;
}

StatusOr<int64_t> ControlPlane::length(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  return s->length();
}

StatusOr<int64_t> ControlPlane::pending(SequenceId id) const {
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  return s->pending;
}

Status ControlPlane::resolve(const std::vector<SequenceId>& ids, bool check_offloaded,
                             const char* what) {
  if (resolved_generation_ == seqs_.generation() && ids == resolved_ids_) {
    if (check_offloaded) {
      for (const Sequence* s : resolved_) {
        if (s->offloaded) {
          return failed_precondition(std::string(what) + ": " + seq_name(s->id) + " is offloaded");
        }
      }
    }
    return ok_status();
  }
  resolved_generation_ = ~uint64_t{0};  // invalid until this lookup succeeds
  resolved_.clear();
  const uint64_t epoch = ++batch_epoch_;
  for (SequenceId id : ids) {
    Sequence* s = seqs_.find(id);
    if (s == nullptr) return unknown(id);
    if (check_offloaded && s->offloaded) {
      return failed_precondition(std::string(what) + ": " + seq_name(id) + " is offloaded");
    }
    if (s->batch_mark == epoch)
      return invalid_argument(std::string(what) + ": " + seq_name(id) + " twice");
    s->batch_mark = epoch;
    resolved_.push_back(s);
  }
  resolved_ids_ = ids;
  resolved_epoch_ = epoch;
  resolved_generation_ = seqs_.generation();
  return ok_status();
}

StatusOr<const BatchMetadata*> ControlPlane::build_batch(const std::vector<SequenceId>& ids,
                                                         const BatchOptions& options) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("build_batch"));
  PAGEDKV_RETURN_IF_ERROR(resolve(ids, /*check_offloaded=*/true, "batch"));
  if (groups_.empty()) {
    PAGEDKV_RETURN_IF_ERROR(batch_.build(resolved_, blocks_, options, widest_));
  } else {
    PAGEDKV_RETURN_IF_ERROR(
        batch_.build_groups(resolved_, blocks_, &groups_.pages(), &group_batch_, options, widest_));
  }
  return &batch_.metadata();
}

const BatchMetadata& ControlPlane::group_batch(int32_t g) const {
  assert(g >= 0 && g < num_groups_);
  if (g == full_group_) return batch_.metadata();
  return group_batch_[groups_.window_index(g)].metadata();
}

StatusOr<std::vector<BlockLocation>> ControlPlane::group_block_locations(SequenceId id,
                                                                         int32_t g) const {
  assert(g >= 0 && g < num_groups_);
  if (g == full_group_) return block_locations(id);
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  return groups_.block_locations(*s, g);
}

Status ControlPlane::group_reserved_slots(SequenceId id, int32_t g,
                                          std::vector<int64_t>* out) const {
  assert(g >= 0 && g < num_groups_);
  if (g == full_group_) return reserved_slots(id, out);
  const Sequence* s = seqs_.find(id);
  if (s == nullptr) return unknown(id);
  if (s->pending > 0 && s->offloaded) {
    return failed_precondition("sequence " + std::to_string(id) +
                               " is offloaded: restore it (or reserve again) before writing");
  }
  groups_.reserved_slots(*s, g, out);
  return ok_status();
}

ControlPlane::GroupPageCounts ControlPlane::group_pages(int32_t g) const {
  assert(g >= 0 && g < num_groups_);
  if (g == full_group_) {
    return GroupPageCounts{blocks_.capacity(Tier::kDevice) - blocks_.free_count(Tier::kDevice),
                           tier(Tier::kDevice).cached_blocks(), counters_.blocks_evicted};
  }
  const GroupPages& p = groups_[groups_.window_index(g)];
  return GroupPageCounts{p.capacity() - p.free_count(), p.cached_count(), p.evicted()};
}

ControlStats ControlPlane::group_stats(int32_t g, int64_t page_bytes) const {
  assert(g >= 0 && g < num_groups_);
  ControlStats st = stats();
  if (groups_.empty()) return st;
  if (g == full_group_) {
    // Its own releases (a window owner's): the counter holds every group's.
    for (const GroupPages& p : groups_) st.window_released_blocks -= p.released();
    return st;
  }
  const GroupPages& p = groups_[groups_.window_index(g)];
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    TierStats& x = t == Tier::kDevice ? st.device : st.host;
    x.total_blocks = p.capacity(t);
    x.free_blocks = p.free_count(t);
    x.cached_blocks = p.cached_count(t);
    x.used_blocks = x.total_blocks - x.free_blocks - x.cached_blocks;
    x.total_bytes = x.total_blocks * page_bytes;
    x.used_bytes = (x.total_blocks - x.free_blocks) * page_bytes;
  }
  st.blocks_evicted = p.evicted();
  st.window_released_blocks = p.released();
  return st;
}

ControlStats ControlPlane::stats() const {
  ControlStats st = counters_;
  st.events_dropped = events_.dropped_total();
  const int64_t bb = config_.block_bytes();
  st.device = tier(Tier::kDevice).stats(bb);
  st.host = tier(Tier::kHost).stats(bb);
  st.sequences = seqs_.size();
  st.active_sequences = static_cast<int64_t>(active_.size());
  return st;
}

std::vector<ControlEvent> ControlPlane::drain_events() { return events_.drain(); }

}  // namespace core
}  // namespace pagedkv
