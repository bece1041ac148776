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

namespace {

// The longest hit of at most `k` whole blocks of a `len`-token prompt within `cap` tokens:
// k blocks give min(k * bs, len - 1) tokens (one token is always left to compute).
int64_t hit_of_blocks(int64_t k, int64_t bs, int64_t len, int64_t cap) {
  for (; k > 0; --k) {
    const int64_t c = std::min(k * bs, len - 1);
    if (c > 0 && c <= cap) return c;
  }
  return 0;
}

// The longest hit of a `len`-token prompt within `cap` tokens, whatever is cached.
int64_t longest_hit(int64_t bs, int64_t len, int64_t cap) {
  return hit_of_blocks(std::min(len / bs, (cap + bs - 1) / bs), bs, len, cap);
}

}  // namespace

StatusOr<StorageLookup> ControlPlane::storage_lookup(const std::vector<TokenId>& prompt,
                                                     NamespaceId ns, int64_t max_blocks,
                                                     int64_t max_cached) const {
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (len > config_.max_sequence_length) {
    return out_of_range("storage_lookup: prompt of " + std::to_string(len) +
                        " tokens exceeds max_sequence_length " +
                        std::to_string(config_.max_sequence_length));
  }
  if (max_cached < -1) {
    return invalid_argument("storage_lookup: max_cached must be >= 0 (or -1: no bound), got " +
                            std::to_string(max_cached));
  }
  const int64_t cap = max_cached < 0 ? len : std::min(max_cached, len);
  StorageLookup out;
  out.ns = ns;
  out.parent_hash = PrefixIndex::root_hash(ns);
  out.prompt_length = len;
  out.cap = cap;
  if (!config_.enable_prefix_caching || max_blocks <= 0) {
    out.cached_reach = out.reach = match_prefix(prompt, ns, cap, nullptr);
    return out;
  }
  if (window_ > 0) {
    storage_lookup_window(prompt, cap, max_blocks, &out);
    return out;
  }
  // No block past those of the longest hit within `cap`.
  const int64_t last = bdiv_.ceil_div(longest_hit(block_size_, len, cap));
  int64_t i = 0;
  for (; i < last; ++i) {
    const NodeId n = index_.find(out.parent, ns, &prompt[static_cast<size_t>(i * block_size_)]);
    if (n < 0) break;
    out.parent = n;
    if (!groups_.empty()) out.found.push_back(index_.node(n).block);
  }
  out.parent_hash = index_.prefix_hash(out.parent, ns);
  out.first_block = i;
  // Several groups: a block counts only with the pages every group's hit needs.
  out.cached_reach =
      groups_.empty() ? hit_of_blocks(i, block_size_, len, cap) : grouped_reach(out, 0, {});
  uint64_t h = out.parent_hash;
  for (; i < last && static_cast<int64_t>(out.hashes.size()) < max_blocks; ++i) {
    const TokenId* block = &prompt[static_cast<size_t>(i * block_size_)];
    h = index_.chain_hash(h, block);
    out.hashes.push_back(h);
    out.tokens.insert(out.tokens.end(), block, block + block_size_);
  }
  out.reach = hit_of_blocks(i, block_size_, len, cap);
  return out;
}

void ControlPlane::storage_lookup_window(const std::vector<TokenId>& prompt, int64_t cap,
                                         int64_t max_blocks, StorageLookup* out) const {
  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t hit = longest_hit(block_size_, len, cap);
  out->cached_reach = match_prefix(prompt, out->ns, cap, nullptr);
  if (hit == 0) return;
  // The blocks the hit's next token attends to; the ones the index lacks are the lookup's.
  const size_t first = window_first_block(hit);
  const size_t end = static_cast<size_t>(bdiv_.ceil_div(hit));
  uint64_t h = out->parent_hash;
  for (size_t i = 0; i < end; ++i) {
    const TokenId* block = &prompt[i * static_cast<size_t>(block_size_)];
    const uint64_t next = index_.chain_hash(h, block);
    const NodeId n = i >= first ? index_.find_flat(h, out->ns, block) : -1;
    if (i >= first && n < 0) {
      out->prefix_hashes.push_back(h);
      out->hashes.push_back(next);
      out->tokens.insert(out->tokens.end(), block, block + block_size_);
      if (!groups_.empty()) out->listed_at.push_back(static_cast<int64_t>(i));
    }
    if (!groups_.empty()) out->found.push_back(n < 0 ? kNoBlock : index_.node(n).block);
    h = next;
  }
  if (static_cast<int64_t>(out->hashes.size()) > max_blocks) {
    // Too many to take: a window with a hole is no hit, so fetch none.
    out->prefix_hashes.clear();
    out->hashes.clear();
    out->tokens.clear();
    out->listed_at.clear();
    out->reach = out->cached_reach;
    return;
  }
  out->reach = hit;
}

int64_t ControlPlane::storage_reach(const StorageLookup& lookup, int64_t n) const {
  if (n >= static_cast<int64_t>(lookup.hashes.size())) return lookup.reach;
  if (window_ > 0 || n <= 0) return lookup.cached_reach;
  return hit_of_blocks(lookup.first_block + n, block_size_, lookup.prompt_length, lookup.cap);
}

int64_t ControlPlane::arrival_room() const {
  const TierStore& host = tier(Tier::kHost);
  return window_ > 0 ? host.free_blocks() : host.room();
}

void ControlPlane::make_arrival_room(NodeId parent, int64_t n, Arrival* out) {
  // Blocks a prompt is about to hit are worth more than the least recently used cached ones, as
  // for any arrival on a tier. The prefix the arrival continues is pinned meanwhile: dropping
  // other branches may make it a leaf.
  LogicalId pinned = parent == kRootNode ? kNoBlock : index_.node(parent).block;
  if (pinned != kNoBlock && blocks_[pinned].tier != Tier::kHost) pinned = kNoBlock;
  if (pinned != kNoBlock) {
    unlist(pinned);
    ++blocks_[pinned].ref;
  }
  Transfers dropped;
  while (tier(Tier::kHost).free_blocks() < n && drop_lru(Tier::kHost, &dropped)) {
  }
  if (pinned != kNoBlock) {
    --blocks_[pinned].ref;
    list_if_evictable(pinned);
  }
  out->host_drops = std::move(dropped.host_drops);
}

StatusOr<Arrival> ControlPlane::begin_arrival(const StorageLookup& lookup, int64_t n,
                                              const std::vector<std::vector<bool>>* group_held) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("begin_arrival"));
  const bool flat = !lookup.prefix_hashes.empty();
  if (n < 0 || n > static_cast<int64_t>(lookup.hashes.size()) ||
      lookup.tokens.size() != lookup.hashes.size() * static_cast<size_t>(block_size_) ||
      (flat && lookup.prefix_hashes.size() != lookup.hashes.size()) ||
      flat != (window_ > 0 && !lookup.hashes.empty())) {
    return invalid_argument("begin_arrival: " + std::to_string(n) + " blocks of a lookup of " +
                            std::to_string(lookup.hashes.size()));
  }
  if (group_held != nullptr) {
    bool ok = !groups_.empty() && group_held->size() == static_cast<size_t>(num_groups_);
    for (size_t g = 0; ok && g < group_held->size(); ++g) {
      const size_t m = (*group_held)[g].size();
      ok = m == 0 || m >= static_cast<size_t>(n);
    }
    if (!ok) {
      return invalid_argument("begin_arrival: group_held needs one entry per group (" +
                              std::to_string(num_groups_) + "), each empty or of at least " +
                              std::to_string(n) + " blocks");
    }
  }
  Arrival out;
  out.reach = lookup.cached_reach;
  const bool parent_alive = lookup.parent == kRootNode ||
                            (lookup.parent < index_.capacity() && index_.node(lookup.parent).live &&
                             index_.node(lookup.parent).hash == lookup.parent_hash);
  if (!parent_alive || n == 0) return out;
  if (!flat) make_arrival_room(lookup.parent, n, &out);
  const int64_t take = std::min(n, tier(Tier::kHost).free_blocks());
  if (take == 0) return out;
  ArrivalRecord record;
  record.lookup.ns = lookup.ns;
  record.lookup.parent = lookup.parent;
  record.lookup.parent_hash = lookup.parent_hash;
  record.lookup.hashes.assign(lookup.hashes.begin(), lookup.hashes.begin() + take);
  record.lookup.tokens.assign(lookup.tokens.begin(), lookup.tokens.begin() + take * block_size_);
  if (flat) {
    record.lookup.prefix_hashes.assign(lookup.prefix_hashes.begin(),
                                       lookup.prefix_hashes.begin() + take);
  }
  for (int64_t i = 0; i < take; ++i) {
    const LogicalId id = blocks_.allocate(Tier::kHost);  // ref 1: held by the arrival
    record.blocks.push_back(id);
    out.host_blocks.push_back(blocks_[id].phys);
  }
  if (groups_.empty()) {
    out.reach = storage_reach(lookup, take);
  } else {
    if (group_held != nullptr) take_arrival_pages(lookup, record.blocks, *group_held, &out);
    out.reach = grouped_reach(lookup, take, out.groups);
    record.groups = out.groups;
  }
  out.id = next_arrival_++;
  arrivals_.emplace(out.id, std::move(record));
  return out;
}

StatusOr<int64_t> ControlPlane::finish_arrival(uint64_t arrival, bool ok) {
  return finish_arrival_partly(arrival, ok ? INT64_MAX : 0);
}

StatusOr<int64_t> ControlPlane::finish_arrival_partly(
    uint64_t arrival, int64_t intact, const std::vector<std::vector<bool>>* group_ok) {
  PAGEDKV_RETURN_IF_ERROR(check_no_open_plan("finish_arrival"));
  if (intact < 0) {
    return invalid_argument("finish_arrival: " + std::to_string(intact) + " intact blocks");
  }
  if (group_ok != nullptr && group_ok->size() != static_cast<size_t>(num_groups_)) {
    return invalid_argument("finish_arrival: group_ok needs one entry per group (" +
                            std::to_string(num_groups_) + ")");
  }
  auto it = arrivals_.find(arrival);
  if (it == arrivals_.end()) {
    return not_found("finish_arrival: arrival " + std::to_string(arrival) + " is not in flight");
  }
  const ArrivalRecord record = std::move(it->second);
  arrivals_.erase(it);
  const StorageLookup& l = record.lookup;
  const size_t good = static_cast<size_t>(std::min<int64_t>(
      intact, static_cast<int64_t>(record.blocks.size())));  // blocks [0, good) arrived intact
  int64_t registered = 0;
  std::vector<bool> registered_at(record.blocks.size(), false);
  if (!l.prefix_hashes.empty()) {
    const bool ok = good == record.blocks.size();
    // A window cache's flat blocks: each stands alone under the hash of the prefix before it.
    for (size_t i = 0; i < record.blocks.size(); ++i) {
      const LogicalId id = record.blocks[i];
      blocks_[id].ref = 0;
      const TokenId* tokens = &l.tokens[i * static_cast<size_t>(block_size_)];
      const PrefixIndex::Lookup at = index_.lookup_flat(l.prefix_hashes[i], l.ns, tokens);
      // Failed, computed (or fetched) again meanwhile, or a key the index would not give the
      // block (the lookup's hashes came from this index: a broken caller). Its pages in the
      // other groups go with it (settle_arrival_pages, before the block is freed).
      if (!ok || at.found >= 0 || at.hash != l.hashes[i]) continue;
      const NodeId node = index_.insert(at, id);
      register_arrived(id, node);
      registered_at[i] = true;
      ++registered;
    }
    settle_arrival_pages(record.groups, record.blocks, registered_at, ok ? INT64_MAX : 0, group_ok);
    for (size_t i = 0; i < record.blocks.size(); ++i) {
      if (!registered_at[i]) blocks_.release(record.blocks[i]);
    }
    counters_.storage_hit_blocks += registered;
    return registered;
  }
  NodeId parent = l.parent;
  bool chained = parent == kRootNode ||
                 (index_.node(parent).live && index_.node(parent).hash == l.parent_hash);
  for (size_t i = 0; i < record.blocks.size(); ++i) {
    const LogicalId id = record.blocks[i];
    BlockInfo& b = blocks_[id];
    b.ref = 0;
    const TokenId* tokens = &l.tokens[i * static_cast<size_t>(block_size_)];
    if (i < good && chained) {
      const PrefixIndex::Lookup at = index_.lookup(parent, l.ns, tokens);
      if (at.found >= 0) {
        // Computed (or fetched) again meanwhile: the index keeps one block per prefix.
        blocks_.release(id);
        parent = at.found;
        continue;
      }
      if (at.hash != l.hashes[i]) {
        // The lookup's hashes were computed by this index: a mismatch means a broken caller.
        blocks_.release(id);
        chained = false;
        continue;
      }
      if (parent != kRootNode) unlist(index_.node(parent).block);  // no longer a host leaf
      const NodeId node = index_.insert(at, id);
      register_arrived(id, node);
      if (parent != kRootNode) list_if_evictable(index_.node(parent).block);
      parent = node;
      registered_at[i] = true;
      ++registered;
      continue;
    }
    chained = false;  // a later block without this one would not be reachable
    blocks_.release(id);
  }
  settle_arrival_pages(record.groups, record.blocks, registered_at, static_cast<int64_t>(good),
                       group_ok);
  counters_.storage_hit_blocks += registered;
  return registered;
}

void ControlPlane::take_arrival_pages(const StorageLookup& lookup,
                                      const std::vector<LogicalId>& blocks,
                                      const std::vector<std::vector<bool>>& group_held,
                                      Arrival* out) {
  // The table index of the i-th arriving block: they follow first_block, or (a window cache)
  // sit where the lookup listed them.
  const bool flat = !lookup.prefix_hashes.empty();
  const int64_t first = lookup.first_block;
  const auto table_index = [&](size_t i) {
    return flat ? lookup.listed_at[i] : first + static_cast<int64_t>(i);
  };
  const int64_t longest = flat ? lookup.reach
                               : hit_of_blocks(first + static_cast<int64_t>(blocks.size()),
                                               block_size_, lookup.prompt_length, lookup.cap);
  for (GroupPages& g : groups_) {
    const std::vector<bool>& held = group_held[static_cast<size_t>(g.config_index())];
    if (held.empty()) continue;
    GroupArrival ga;
    ga.group = g.config_index();
    // A window needs the pages of the hit's last blocks: nearest the hit first, as far as
    // the pool allows.
    const int64_t from = static_cast<int64_t>(g.first_block(longest));
    for (size_t i = blocks.size(); i-- > 0 && g.room(Tier::kHost) > 0;) {
      if (table_index(i) < from) break;
      if (!held[i]) continue;
      const LogicalId evicted = g.take(blocks[i], Tier::kHost);
      if (evicted != kNoBlock) emit_page_event(EventKind::kBlockRemoved, evicted, g, Tier::kHost);
      ga.index.push_back(static_cast<int32_t>(i));
      ga.pages.push_back(g.page(blocks[i]));
    }
    if (!ga.index.empty()) out->groups.push_back(std::move(ga));
  }
}

int64_t ControlPlane::grouped_reach(const StorageLookup& lookup, int64_t take,
                                    const std::vector<GroupArrival>& pages) const {
  // arrived[w][i]: window group w gets a page for the i-th arriving block.
  std::vector<std::vector<bool>> arrived(groups_.size(),
                                         std::vector<bool>(static_cast<size_t>(take), false));
  for (const GroupArrival& ga : pages) {
    for (const int32_t i : ga.index)
      arrived[groups_.window_index(ga.group)][static_cast<size_t>(i)] = true;
  }
  if (!lookup.prefix_hashes.empty()) return grouped_window_reach(lookup, take, arrived);
  const int64_t first = lookup.first_block;
  const int64_t end = first + take;
  const auto present = [&](size_t w, int64_t j) {
    if (j >= first) return static_cast<bool>(arrived[w][static_cast<size_t>(j - first)]);
    return j < static_cast<int64_t>(lookup.found.size()) &&
           groups_[w].page(lookup.found[static_cast<size_t>(j)]) >= 0;
  };
  for (int64_t k = end; k > 0; --k) {
    const int64_t c = std::min(k * block_size_, lookup.prompt_length - 1);
    if (c <= 0 || c > lookup.cap) continue;
    bool covered = true;
    for (size_t w = 0; covered && w < groups_.size(); ++w) {
      for (int64_t j = static_cast<int64_t>(groups_[w].first_block(c)); j < bdiv_.ceil_div(c);
           ++j) {
        if (!present(w, j)) {
          covered = false;
          break;
        }
      }
    }
    if (covered) return c;
  }
  return 0;
}

int64_t ControlPlane::grouped_window_reach(const StorageLookup& lookup, int64_t take,
                                           const std::vector<std::vector<bool>>& arrived) const {
  // A window with a hole is no hit: the blocks come all or none, and so do the pages the other
  // groups' windows need at the hit.
  if (take < static_cast<int64_t>(lookup.hashes.size())) return lookup.cached_reach;
  const int64_t c = lookup.reach;
  for (size_t w = 0; w < groups_.size(); ++w) {
    size_t k = 0;  // the next listed block
    for (int64_t j = static_cast<int64_t>(groups_[w].first_block(c)); j < bdiv_.ceil_div(c); ++j) {
      while (k < lookup.listed_at.size() && lookup.listed_at[k] < j) ++k;
      const bool listed = k < lookup.listed_at.size() && lookup.listed_at[k] == j;
      const bool present = listed ? static_cast<bool>(arrived[w][k])
                                  : lookup.found[static_cast<size_t>(j)] != kNoBlock &&
                                        groups_[w].page(lookup.found[static_cast<size_t>(j)]) >= 0;
      if (!present) return lookup.cached_reach;
    }
  }
  return c;
}

void ControlPlane::settle_arrival_pages(const std::vector<GroupArrival>& pages,
                                        const std::vector<LogicalId>& blocks,
                                        const std::vector<bool>& registered, int64_t intact,
                                        const std::vector<std::vector<bool>>* group_ok) {
  for (const GroupArrival& ga : pages) {
    GroupPages& g = groups_[groups_.window_index(ga.group)];
    const std::vector<bool>* ok =
        group_ok == nullptr ? nullptr : &(*group_ok)[static_cast<size_t>(ga.group)];
    for (size_t k = 0; k < ga.index.size(); ++k) {
      const size_t i = static_cast<size_t>(ga.index[k]);
      const bool arrived = ok == nullptr ? static_cast<int64_t>(i) < intact
                                         : k < ok->size() && static_cast<bool>((*ok)[k]);
      // A page of a block that joined the index is kept as a cached host page; else it is
      // freed with its block.
      const bool keep = registered[i] && arrived;
      g.drop(blocks[i], keep, Tier::kHost);
      if (keep) emit_page_event(EventKind::kBlockStored, blocks[i], g, Tier::kHost);
    }
  }
}

void ControlPlane::register_arrived(LogicalId id, NodeId node) {
  BlockInfo& b = blocks_[id];
  b.node = node;
  b.last_access = ++tick_;
  b.retention = kDefaultRetentionPriority;
  b.expiry_ns = 0;
  tier(Tier::kHost).add_cached();
  list_if_evictable(id);
  emit_block_event(EventKind::kBlockStored, node);
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
  e.group = block.group;
  events_.push(std::move(e));
}

}  // namespace core
}  // namespace pagedkv
