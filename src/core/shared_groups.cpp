// The groups of a plane that share its logical blocks (shared_groups.hpp): who holds their
// pages, what a hit, a rollback, a new block and a move need from them, their undo and their
// invariants.
#include "core/shared_groups.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

namespace {

std::string group_name(const GroupPages& g) { return "group " + std::to_string(g.config_index()); }

}  // namespace

Status SharedGroups::check_config(const CacheConfig& config, int32_t* owner) {
  if (config.groups.size() == 1) {
    return invalid_argument("groups: one group: create the plane from config.group_config(0)");
  }
  // The owner attends furthest back: no window (0 counts as unbounded), else the widest one. Its
  // blocks then cover every other group's pages.
  const auto reach = [](const KvGroup& k) {
    return k.sliding_window == 0 ? std::numeric_limits<int64_t>::max()
                                 : static_cast<int64_t>(k.sliding_window);
  };
  *owner = 0;
  for (size_t g = 1; g < config.groups.size(); ++g) {
    const KvGroup& k = config.groups[g];
    const KvGroup& o = config.groups[static_cast<size_t>(*owner)];
    if (reach(k) > reach(o) ||
        (reach(k) == reach(o) && k.num_device_blocks > o.num_device_blocks)) {
      *owner = static_cast<int32_t>(g);
    }
  }
  return ok_status();
}

SharedGroups::SharedGroups(const CacheConfig& config, int32_t owner, const BlockAllocator* blocks,
                           Journal* journal, PageEventSink events, bool track_origins)
    : owner_(owner),
      block_size_(config.block_size),
      bdiv_(config.block_size),
      blocks_(blocks),
      journal_(journal),
      events_(std::move(events)) {
  // Each window size's bound in Sequence::window_bound: groups of one size hold the same pages
  // of a sequence, so they share it.
  std::vector<int32_t> sizes;
  const auto live_slot = [&sizes](int32_t window) {
    if (window == 0) return -1;
    const auto it = std::find(sizes.begin(), sizes.end(), window);
    if (it != sizes.end()) return static_cast<int32_t>(it - sizes.begin());
    sizes.push_back(window);
    return static_cast<int32_t>(sizes.size()) - 1;
  };
  for (int32_t g = 0; g < static_cast<int32_t>(config.groups.size()); ++g) {
    if (g == owner) continue;
    const KvGroup& k = config.groups[static_cast<size_t>(g)];
    pages_.emplace_back(g, k.sliding_window, live_slot(k.sliding_window), config.block_size,
                        k.num_device_blocks, k.num_host_blocks, blocks->num_logical());
    if (track_origins) {
      origins_.emplace_back();
      origins_.back().resize(k.num_device_blocks, k.num_host_blocks);
    }
  }
}

void SharedGroups::hold(const Sequence& s, size_t i, LogicalId b) {
  for (size_t w = 0; w < pages_.size(); ++w) {
    if (i >= pages_[w].first_held(s)) pages_[w].hold(b, (*blocks_)[b].tier);
  }
}

void SharedGroups::drop(const Sequence& s, size_t i, LogicalId b, bool undoable) {
  if (pages_.empty()) return;
  const Tier t = (*blocks_)[b].tier;
  const bool cacheable = (*blocks_)[b].node >= 0;
  for (size_t w = 0; w < pages_.size(); ++w) {
    if (i < pages_[w].first_held(s)) continue;
    if (undoable) {
      journal_->group_ops.push_back(Journal::GroupOp{
          Journal::GroupOpKind::kDrop, t, static_cast<int32_t>(w), b, pages_[w].page(b), -1});
    }
    pages_[w].drop(b, cacheable, t);
  }
}

bool SharedGroups::can_swap(const Sequence& s, size_t i, LogicalId ours, LogicalId theirs) const {
  for (size_t w = 0; w < pages_.size(); ++w) {
    const GroupPages& g = pages_[w];
    if (i >= g.first_held(s) && g.page(theirs) < 0 && g.holders(ours) != 1) return false;
  }
  return true;
}

void SharedGroups::swap(const Sequence& s, size_t i, LogicalId ours, LogicalId theirs) {
  // `ours` is not indexed (register_full_block returns first when it is): its pages are freed.
  for (size_t w = 0; w < pages_.size(); ++w) {
    GroupPages& g = pages_[w];
    if (i < g.first_held(s)) continue;
    if (g.page(theirs) >= 0) {
      g.hold(theirs, (*blocks_)[theirs].tier);
      g.drop(ours, /*cacheable=*/false, Tier::kDevice);
    } else {
      g.adopt(ours, theirs);  // a window page of theirs was evicted: ours has the same bytes
      page_event(EventKind::kBlockStored, theirs, g);
    }
  }
}

bool SharedGroups::cover(const std::vector<LogicalId>& found, int64_t c) const {
  const size_t end = static_cast<size_t>(bdiv_.ceil_div(c));
  for (const GroupPages& g : pages_) {
    for (size_t i = g.first_block(c); i < end; ++i) {
      if (g.page(found[i]) < 0) return false;
    }
  }
  return true;
}

void SharedGroups::set_first_held(Sequence* s, int64_t length) const {
  for (const GroupPages& g : pages_) g.set_first_held(s, g.first_block(length));
}

void SharedGroups::clamp_first_held(Sequence* s, size_t keep) const {
  for (const GroupPages& g : pages_) {
    g.set_first_held(s, std::min(g.first_held(*s), keep));
  }
}

int64_t SharedGroups::trim_windows(Sequence* s) {
  const int64_t len = s->length();
  int64_t released = 0;
  bool moved = false;
  for (GroupPages& g : pages_) {
    const size_t first = g.first_block(len);
    const size_t from = g.first_held(*s);
    if (first <= from) continue;
    for (size_t i = from; i < first; ++i) {
      const BlockInfo& b = (*blocks_)[s->blocks[i]];
      g.drop(s->blocks[i], b.node >= 0, b.tier);
    }
    g.count_released(static_cast<int64_t>(first - from));
    released += static_cast<int64_t>(first - from);
    moved = true;
  }
  // The bounds move once every group has dropped: groups of one window size share theirs.
  if (moved) {
    for (const GroupPages& g : pages_) {
      g.set_first_held(s, std::max(g.first_block(len), g.first_held(*s)));
    }
  }
  return released;
}

void SharedGroups::take(LogicalId id) {
  for (size_t w = 0; w < pages_.size(); ++w) {
    const LogicalId evicted = pages_[w].take(id);
    if (evicted != kNoBlock) page_event(EventKind::kBlockRemoved, evicted, pages_[w]);
    journal_->group_ops.push_back(Journal::GroupOp{Journal::GroupOpKind::kTake, Tier::kDevice,
                                                   static_cast<int32_t>(w), id, pages_[w].page(id),
                                                   -1});
  }
}

void SharedGroups::move(LogicalId id, Tier from, Tier to, Transfers* out) {
  if (pages_.empty()) return;
  const bool registered = (*blocks_)[id].node >= 0;
  for (size_t w = 0; w < pages_.size(); ++w) {
    GroupPages& g = pages_[w];
    const int32_t src = g.page(id);
    if (src < 0) continue;
    if (g.holders(id) == 0 && g.room(to) == 0) {
      // A cached page goes with its block only where a page is free or cached.
      g.release(id, from);
      page_event(EventKind::kBlockRemoved, id, g, from);
      continue;
    }
    const bool cached = g.holders(id) == 0;
    LogicalId evicted = kNoBlock;
    const int32_t dst = g.move(id, from, to, &evicted);
    if (evicted != kNoBlock) page_event(EventKind::kBlockRemoved, evicted, g, to);
    journal_->group_ops.push_back(Journal::GroupOp{
        cached ? Journal::GroupOpKind::kMoveCached : Journal::GroupOpKind::kMove, from,
        static_cast<int32_t>(w), id, src, static_cast<int32_t>(out->moves.size())});
    out->moves.push_back(BlockMove{from, src, to, dst, g.config_index()});
    if (!origins_.empty()) origins_[w].record(out->moves.back());
    if (registered) {  // as the full group's tier change: stored there, then gone from here
      page_event(EventKind::kBlockStored, id, g, to, /*revocable=*/!cached);
      page_event(EventKind::kBlockRemoved, id, g, from, /*revocable=*/!cached);
    }
  }
}

void SharedGroups::add_need(const Sequence& s, int64_t new_blocks,
                            std::vector<int64_t>* need) const {
  for (size_t w = 0; w < pages_.size(); ++w) {
    (*need)[w] += new_blocks + (s.offloaded ? restore_pages(s, w) : 0);
  }
}

int64_t SharedGroups::restore_pages(const Sequence& s, size_t w) const {
  const GroupPages& g = pages_[w];
  int64_t n = 0;
  for (size_t i = s.first_live; i < s.blocks.size(); ++i) {
    const LogicalId b = s.blocks[i];
    if (b != kNoBlock && (*blocks_)[b].tier == Tier::kHost && g.holders(b) > 0) ++n;
  }
  return n;
}

int64_t SharedGroups::offload_pages(const Sequence& s, size_t w) const {
  int64_t n = 0;
  for (size_t i = pages_[w].first_held(s); i < s.blocks.size(); ++i) {
    const LogicalId b = s.blocks[i];
    const BlockInfo& info = (*blocks_)[b];
    if (info.tier == Tier::kDevice && pages_[w].page(b) >= 0 && info.ref == 1) ++n;
  }
  return n;
}

void SharedGroups::undo(int64_t moves_done, std::vector<BlockMove>* inverse,
                        std::vector<int32_t>* inverts) {
  if (pages_.empty()) return;  // a one-group plane journals no page
  // Newest first: a page a drop or a move freed was only ever taken again by a later take or
  // move of the call, which is undone first. Pages taken by evicting cached ones stay taken.
  for (auto it = journal_->group_ops.rbegin(); it != journal_->group_ops.rend(); ++it) {
    GroupPages& g = pages_[static_cast<size_t>(it->group)];
    switch (it->kind) {
      case Journal::GroupOpKind::kTake:
        g.untake(it->block);
        break;
      case Journal::GroupOpKind::kDrop:
        g.undrop(it->block, it->page, it->tier);
        break;
      case Journal::GroupOpKind::kMoveCached:
        // The page may have been evicted since. Still cached, it is evicted now, as a failed
        // call may evict unreferenced cached pages (its old page may be taken by then, and its
        // move's events stand: a router heard of it, so it hears of the eviction too).
        if (g.page(it->block) < 0) break;
        if (g.cached(it->block)) {
          const Tier now = it->tier == Tier::kDevice ? Tier::kHost : Tier::kDevice;
          g.evict(it->block, now);
          page_event(EventKind::kBlockRemoved, it->block, g, now);
          break;
        }
        [[fallthrough]];  // held since, in the same call: moved back as a held page
      case Journal::GroupOpKind::kMove: {
        const Tier now = it->tier == Tier::kDevice ? Tier::kHost : Tier::kDevice;
        if (it->move_index < moves_done) {
          inverse->push_back(
              BlockMove{now, g.page(it->block), it->tier, it->page, g.config_index()});
          if (inverts != nullptr) inverts->push_back(it->move_index);
        }
        g.move_back(it->block, now, it->tier, it->page);
        break;
      }
    }
  }
}

void SharedGroups::copy(LogicalId src, LogicalId dst, Transfers* out) const {
  for (const GroupPages& g : pages_) {
    out->copies.push_back(BlockCopy{g.page(src), g.page(dst), g.config_index()});
  }
}

Status SharedGroups::check_rollback(const Sequence& s, int64_t length) const {
  for (size_t w = 0; w < pages_.size(); ++w) {
    const GroupPages& g = pages_[w];
    const size_t held = g.first_held(s);
    if (length == 0 || g.first_block(length) >= held) continue;
    const int64_t first = static_cast<int64_t>(held) * block_size_;
    return failed_precondition("rollback: " + seq_name(s.id) + " no longer holds the tokens " +
                               "before " + std::to_string(first) + " in " + group_name(g) +
                               " (they fell out of its sliding window); the shortest length it "
                               "can roll back to is " +
                               std::to_string(first + g.window()) + " (or 0)");
  }
  return ok_status();
}

Status SharedGroups::check(const SequenceTable& seqs,
                           const std::vector<std::vector<LogicalId>>& arriving) const {
  const auto broken = [](const std::string& what) { return internal_error("invariant: " + what); };
  const int64_t nlog = blocks_->num_logical();
  for (size_t w = 0; w < pages_.size(); ++w) {
    const GroupPages& g = pages_[w];
    const std::string name = group_name(g);
    std::vector<int32_t> holders(static_cast<size_t>(nlog), 0);
    for (const auto& kv : seqs.all()) {
      const Sequence& s = *kv.second;
      const size_t held = g.first_held(s);
      if (held > s.blocks.size()) {
        return broken(name + ": sequence " + std::to_string(s.id) + " first live index past " +
                      "its table");
      }
      if (held > g.first_block(s.length())) {
        return broken(name + ": sequence " + std::to_string(s.id) +
                      " lacks pages its window needs");
      }
      for (size_t i = held; i < s.blocks.size(); ++i) {
        ++holders[static_cast<size_t>(s.blocks[i])];
      }
    }
    // A page coming back from a store is held by its arrival.
    for (const LogicalId b : arriving[w]) ++holders[static_cast<size_t>(b)];
    int64_t owned[kNumTiers] = {0, 0};
    int64_t cached[kNumTiers] = {0, 0};
    std::vector<LogicalId> owner[kNumTiers];
    for (int t = 0; t < kNumTiers; ++t) {
      owner[t].assign(static_cast<size_t>(g.capacity(static_cast<Tier>(t))), kNoBlock);
    }
    for (LogicalId b = 0; b < nlog; ++b) {
      const size_t i = static_cast<size_t>(b);
      const int32_t p = g.page(b);
      if (g.holders(b) != holders[i]) {
        return broken(name + ": block " + std::to_string(b) + " has " +
                      std::to_string(g.holders(b)) + " holders, recounted " +
                      std::to_string(holders[i]));
      }
      if (p < 0) {
        if (holders[i] > 0) {
          return broken(name + ": held block " + std::to_string(b) + " has no page");
        }
        continue;
      }
      if (!blocks_->live(b)) {
        return broken(name + ": free block " + std::to_string(b) + " has a page");
      }
      // A page is in the pool of the tier its block is on.
      const int t = static_cast<int>((*blocks_)[b].tier);
      ++owned[t];
      if (p >= g.capacity((*blocks_)[b].tier) || owner[t][static_cast<size_t>(p)] != kNoBlock) {
        return broken(name + ": page " + std::to_string(p) + " of block " + std::to_string(b) +
                      " is out of range or another block's too");
      }
      owner[t][static_cast<size_t>(p)] = b;
      // Nobody attends to it: it is kept only as a cached page of an indexed block.
      if (holders[i] == 0) {
        if ((*blocks_)[b].node < 0) {
          return broken(name + ": block " + std::to_string(b) +
                        " keeps a page nobody holds, out of the index");
        }
        ++cached[t];
      }
    }
    for (int t = 0; t < kNumTiers; ++t) {
      // Every free page is in range, nobody's, and free once.
      for (const int32_t p : g.free_pages(static_cast<Tier>(t))) {
        if (p < 0 || p >= g.capacity(static_cast<Tier>(t)) ||
            owner[t][static_cast<size_t>(p)] != kNoBlock) {
          return broken(name + ": free page " + std::to_string(p) + " of tier " +
                        std::to_string(t) + " is out of range, owned or free twice");
        }
        owner[t][static_cast<size_t>(p)] = -2;  // seen free
      }
      if (owned[t] + g.free_count(static_cast<Tier>(t)) != g.capacity(static_cast<Tier>(t))) {
        return broken(name + ": tier " + std::to_string(t) + " pages owned " +
                      std::to_string(owned[t]) + " + free " +
                      std::to_string(g.free_count(static_cast<Tier>(t))) +
                      " != " + std::to_string(g.capacity(static_cast<Tier>(t))));
      }
    }
    for (int t = 0; t < kNumTiers; ++t) {
      if (cached[t] != g.cached_count(static_cast<Tier>(t))) {
        return broken(name + ": tier " + std::to_string(t) + " " +
                      std::to_string(g.cached_count(static_cast<Tier>(t))) +
                      " cached pages counted, " + std::to_string(cached[t]) + " recounted");
      }
    }
    if (!g.list_consistent()) return broken(name + ": a list of cached pages is broken");
  }
  return ok_status();
}

// ---------------------------------------------------------------- queries per group

std::vector<BlockLocation> SharedGroups::block_locations(const Sequence& s, int32_t g) const {
  const GroupPages& pages = pages_[window_index(g)];
  std::vector<BlockLocation> out(s.blocks.size(), BlockLocation{Tier::kDevice, -1});
  for (size_t i = pages.first_held(s); i < s.blocks.size(); ++i) {
    const LogicalId b = s.blocks[i];
    // A page's tier is its block's: the pages follow their blocks between tiers.
    out[i] = BlockLocation{(*blocks_)[b].tier, pages.page(b)};
  }
  return out;
}

void SharedGroups::reserved_slots(const Sequence& s, int32_t g, std::vector<int64_t>* out) const {
  // Reserved positions are past the committed length, so inside every window.
  const GroupPages& pages = pages_[window_index(g)];
  const int64_t len = s.length();
  for (int64_t p = len; p < len + s.pending; ++p) {
    const LogicalId b = s.blocks[static_cast<size_t>(bdiv_.div(p))];
    out->push_back(static_cast<int64_t>(pages.page(b)) * block_size_ + bdiv_.mod(p));
  }
}

}  // namespace core
}  // namespace pagedkv
