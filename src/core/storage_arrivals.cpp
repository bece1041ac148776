// Blocks coming back from a storage tier. The runtime asks which keys a store may hold for a
// prompt (storage_lookup), takes host slots for the ones it holds (begin_arrival), lets the
// store read into them, and reports the outcome (finish_arrival): read blocks join the prefix
// index as cached host blocks, after which prompts hit them like any host block. Until then
// they are held by the arrival, outside every sequence and queue, so nothing else can take or
// read their slots while the store writes them.
#include <algorithm>
#include <string>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {

StatusOr<StorageLookup> ControlPlane::storage_lookup(const std::vector<TokenId>& prompt,
                                                     NamespaceId ns, int64_t max_blocks) const {
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (len > config_.max_sequence_length) {
    return out_of_range("storage_lookup: prompt of " + std::to_string(len) +
                        " tokens exceeds max_sequence_length " +
                        std::to_string(config_.max_sequence_length));
  }
  StorageLookup out;
  out.ns = ns;
  out.parent_hash = PrefixIndex::root_hash(ns);
  // A window cache's flat nodes are not read back from a store (KvCache refuses a storage tier
  // for one): nothing to fetch.
  if (!config_.enable_prefix_caching || max_blocks <= 0 || window_ > 0) return out;
  int64_t i = 0;
  for (; (i + 1) * block_size_ <= len; ++i) {
    const NodeId n = index_.find(out.parent, ns, &prompt[static_cast<size_t>(i * block_size_)]);
    if (n < 0) break;
    out.parent = n;
  }
  out.parent_hash = index_.prefix_hash(out.parent, ns);
  uint64_t h = out.parent_hash;
  for (; (i + 1) * block_size_ <= len && static_cast<int64_t>(out.hashes.size()) < max_blocks;
       ++i) {
    const TokenId* block = &prompt[static_cast<size_t>(i * block_size_)];
    h = index_.chain_hash(h, block);
    out.hashes.push_back(h);
    out.tokens.insert(out.tokens.end(), block, block + block_size_);
  }
  return out;
}

StatusOr<Arrival> ControlPlane::begin_arrival(const StorageLookup& lookup, int64_t n) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("begin_arrival"));
  if (n < 0 || n > static_cast<int64_t>(lookup.hashes.size()) ||
      lookup.tokens.size() != lookup.hashes.size() * static_cast<size_t>(block_size_)) {
    return invalid_argument("begin_arrival: " + std::to_string(n) + " blocks of a lookup of " +
                            std::to_string(lookup.hashes.size()));
  }
  Arrival out;
  const bool parent_alive = lookup.parent == kRootNode ||
                            (lookup.parent < index_.capacity() && index_.node(lookup.parent).live &&
                             index_.node(lookup.parent).hash == lookup.parent_hash);
  const int64_t take = std::min(n, tier(Tier::kHost).free_blocks());
  if (!parent_alive || take == 0) return out;
  ArrivalRecord record;
  record.lookup.ns = lookup.ns;
  record.lookup.parent = lookup.parent;
  record.lookup.parent_hash = lookup.parent_hash;
  record.lookup.hashes.assign(lookup.hashes.begin(), lookup.hashes.begin() + take);
  record.lookup.tokens.assign(lookup.tokens.begin(), lookup.tokens.begin() + take * block_size_);
  for (int64_t i = 0; i < take; ++i) {
    const LogicalId id = blocks_.allocate(Tier::kHost);  // ref 1: held by the arrival
    record.blocks.push_back(id);
    out.host_blocks.push_back(blocks_[id].phys);
  }
  out.id = next_arrival_++;
  arrivals_.emplace(out.id, std::move(record));
  return out;
}

StatusOr<int64_t> ControlPlane::finish_arrival(uint64_t arrival, bool ok) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("finish_arrival"));
  auto it = arrivals_.find(arrival);
  if (it == arrivals_.end()) {
    return not_found("finish_arrival: arrival " + std::to_string(arrival) + " is not in flight");
  }
  const ArrivalRecord record = std::move(it->second);
  arrivals_.erase(it);
  const StorageLookup& l = record.lookup;
  NodeId parent = l.parent;
  bool chained = parent == kRootNode ||
                 (index_.node(parent).live && index_.node(parent).hash == l.parent_hash);
  int64_t registered = 0;
  for (size_t i = 0; i < record.blocks.size(); ++i) {
    const LogicalId id = record.blocks[i];
    BlockInfo& b = blocks_[id];
    b.ref = 0;
    const TokenId* tokens = &l.tokens[i * static_cast<size_t>(block_size_)];
    if (ok && chained) {
      const NodeId existing = index_.find(parent, l.ns, tokens);
      if (existing >= 0) {
        // Computed (or fetched) again meanwhile: the index keeps one block per prefix.
        blocks_.release(id);
        parent = existing;
        continue;
      }
      if (parent != kRootNode) unlist(index_.node(parent).block);  // no longer a host leaf
      b.node = index_.insert(parent, l.ns, tokens, id);
      if (index_.node(b.node).hash != l.hashes[i]) {
        // The lookup's hashes were computed by this index: a mismatch means a broken caller.
        remove_node(b.node);
        b.node = -1;
        blocks_.release(id);
        chained = false;
        continue;
      }
      b.last_access = ++tick_;
      b.retention = kDefaultRetentionPriority;
      b.expiry_ns = 0;
      tier(Tier::kHost).add_cached();
      list_if_evictable(id);
      if (parent != kRootNode) list_if_evictable(index_.node(parent).block);
      emit_block_event(EventKind::kBlockStored, b.node);
      parent = b.node;
      ++registered;
      continue;
    }
    chained = false;  // a later block without this one would not be reachable
    blocks_.release(id);
  }
  counters_.storage_hit_blocks += registered;
  return registered;
}

void ControlPlane::record_stored_in_storage(const DroppedBlock& block) {
  if (!events_enabled_) return;
  ControlEvent e;
  e.kind = EventKind::kBlockStored;
  e.tier = Tier::kStorage;
  e.block_hash = block.block_hash;
  e.parent_hash = block.parent_hash;
  e.ns = block.ns;
  e.tokens = block.tokens;
  events_.push(std::move(e));
}

}  // namespace core
}  // namespace pagedkv
