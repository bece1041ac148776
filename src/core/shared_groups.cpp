// The window groups of a plane whose groups share the logical blocks (control_plane.hpp): who
// holds their pages, what a hit, a rollback and a new block need from them, and their part of
// check_invariants(). A sequence holds the page of its block at table index i in window group w
// while i >= group_first_live[w]; a commit moves that bound as the window moves.
#include <string>
#include <vector>

#include "core/control_plane.hpp"
#include "core/sequence_errors.hpp"

namespace pagedkv {
namespace core {

namespace {

std::string group_name(const GroupPages& g) { return "group " + std::to_string(g.config_index()); }

}  // namespace

void ControlPlane::hold_group_pages(const Sequence& s, size_t i, LogicalId b) {
  for (size_t w = 0; w < groups_.size(); ++w) {
    if (i >= s.group_first_live[w]) groups_[w].hold(b);
  }
}

void ControlPlane::drop_group_pages(const Sequence& s, size_t i, LogicalId b, bool undoable) {
  const bool registered = blocks_[b].node >= 0;
  for (size_t w = 0; w < groups_.size(); ++w) {
    if (i < s.group_first_live[w]) continue;
    if (undoable) {
      journal_.group_ops.push_back(
          Journal::GroupOp{false, static_cast<int32_t>(w), b, groups_[w].page(b)});
    }
    groups_[w].drop(b, registered);
  }
}

bool ControlPlane::group_pages_can_swap(const Sequence& s, size_t i, LogicalId ours,
                                        LogicalId theirs) const {
  for (size_t w = 0; w < groups_.size(); ++w) {
    const GroupPages& g = groups_[w];
    if (i >= s.group_first_live[w] && g.page(theirs) < 0 && g.holders(ours) != 1) return false;
  }
  return true;
}

void ControlPlane::swap_group_pages(const Sequence& s, size_t i, LogicalId ours, LogicalId theirs) {
  const bool ours_registered = blocks_[ours].node >= 0;
  for (size_t w = 0; w < groups_.size(); ++w) {
    GroupPages& g = groups_[w];
    if (i < s.group_first_live[w]) continue;
    if (g.page(theirs) >= 0) {
      g.hold(theirs);
      g.drop(ours, ours_registered);
    } else {
      g.adopt(ours, theirs);  // a window page of theirs was evicted: ours has the same bytes
      emit_page_event(EventKind::kBlockStored, theirs, g);
    }
  }
}

bool ControlPlane::group_pages_cover(const std::vector<LogicalId>& found, int64_t c) const {
  const size_t end = static_cast<size_t>(bdiv_.ceil_div(c));
  for (const GroupPages& g : groups_) {
    for (size_t i = g.first_block(c); i < end; ++i) {
      if (g.page(found[i]) < 0) return false;
    }
  }
  return true;
}

void ControlPlane::set_group_first_live(Sequence* s, int64_t length) {
  for (size_t w = 0; w < groups_.size(); ++w) {
    s->group_first_live[w] = static_cast<uint32_t>(groups_[w].first_block(length));
  }
}

void ControlPlane::trim_group_windows(Sequence* s) {
  const int64_t len = s->length();
  for (size_t w = 0; w < groups_.size(); ++w) {
    GroupPages& g = groups_[w];
    const size_t first = g.first_block(len);
    const size_t from = s->group_first_live[w];
    if (first <= from) continue;
    for (size_t i = from; i < first; ++i) {
      const LogicalId b = s->blocks[i];
      g.drop(b, blocks_[b].node >= 0);
    }
    counters_.window_released_blocks += static_cast<int64_t>(first - from);
    s->group_first_live[w] = static_cast<uint32_t>(first);
  }
}

void ControlPlane::emit_page_event(EventKind kind, LogicalId b, const GroupPages& g) {
  if (!events_enabled_) return;  // before reading the block: an eviction's record is cold
  emit_block_event(kind, blocks_[b].node, Tier::kDevice, /*revocable=*/false, g.config_index());
}

void ControlPlane::take_group_pages(LogicalId id) {
  for (size_t w = 0; w < groups_.size(); ++w) {
    const LogicalId evicted = groups_[w].take(id);
    if (evicted != kNoBlock) emit_page_event(EventKind::kBlockRemoved, evicted, groups_[w]);
    journal_.group_ops.push_back(
        Journal::GroupOp{true, static_cast<int32_t>(w), id, groups_[w].page(id)});
  }
}

void ControlPlane::undo_group_ops() {
  // Newest first: a page a drop freed was only ever taken again by a later take of the call,
  // which is undone first. Pages taken by evicting cached ones stay taken from them.
  for (auto it = journal_.group_ops.rbegin(); it != journal_.group_ops.rend(); ++it) {
    GroupPages& g = groups_[static_cast<size_t>(it->group)];
    if (it->take) {
      g.untake(it->block);
    } else {
      g.undrop(it->block, it->page);
    }
  }
}

void ControlPlane::copy_group_pages(LogicalId src, LogicalId dst, Transfers* out) const {
  for (const GroupPages& g : groups_) {
    out->copies.push_back(BlockCopy{g.page(src), g.page(dst), g.config_index()});
  }
}

Status ControlPlane::check_group_windows_rollback(const Sequence& s, int64_t length) const {
  for (size_t w = 0; w < groups_.size(); ++w) {
    const GroupPages& g = groups_[w];
    if (length == 0 || g.first_block(length) >= s.group_first_live[w]) continue;
    const int64_t first = static_cast<int64_t>(s.group_first_live[w]) * block_size_;
    return failed_precondition("rollback: " + seq_name(s.id) + " no longer holds the tokens " +
                               "before " + std::to_string(first) + " in " + group_name(g) +
                               " (they fell out of its sliding window); the shortest length it "
                               "can roll back to is " +
                               std::to_string(first + g.window()) + " (or 0)");
  }
  return ok_status();
}

Status ControlPlane::check_group_invariants() const {
  const auto broken = [](const std::string& what) { return internal_error("invariant: " + what); };
  const int64_t nlog = blocks_.num_logical();
  for (size_t w = 0; w < groups_.size(); ++w) {
    const GroupPages& g = groups_[w];
    const std::string name = group_name(g);
    std::vector<int32_t> holders(static_cast<size_t>(nlog), 0);
    for (const auto& kv : seqs_.all()) {
      const Sequence& s = *kv.second;
      if (s.group_first_live[w] > s.blocks.size()) {
        return broken(name + ": sequence " + std::to_string(s.id) + " first live index past " +
                      "its table");
      }
      if (s.group_first_live[w] > g.first_block(s.length())) {
        return broken(name + ": sequence " + std::to_string(s.id) +
                      " lacks pages its window needs");
      }
      for (size_t i = s.group_first_live[w]; i < s.blocks.size(); ++i) {
        ++holders[static_cast<size_t>(s.blocks[i])];
      }
    }
    int64_t owned = 0;
    int64_t cached = 0;
    std::vector<LogicalId> owner(static_cast<size_t>(g.capacity()), kNoBlock);
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
      ++owned;
      if (!blocks_.live(b)) {
        return broken(name + ": free block " + std::to_string(b) + " has a page");
      }
      if (p >= g.capacity() || owner[static_cast<size_t>(p)] != kNoBlock) {
        return broken(name + ": page " + std::to_string(p) + " of block " + std::to_string(b) +
                      " is out of range or another block's too");
      }
      owner[static_cast<size_t>(p)] = b;
      // Nobody attends to it: it is kept only as a cached page of an indexed block.
      if (holders[i] == 0) {
        if (blocks_[b].node < 0) {
          return broken(name + ": block " + std::to_string(b) +
                        " keeps a page nobody holds, and is not in the prefix index");
        }
        ++cached;
      }
    }
    // Every free page is in range, nobody's, and free once.
    for (const int32_t p : g.free_pages()) {
      if (p < 0 || p >= g.capacity() || owner[static_cast<size_t>(p)] != kNoBlock) {
        return broken(name + ": free page " + std::to_string(p) +
                      " is out of range, owned or free twice");
      }
      owner[static_cast<size_t>(p)] = -2;  // seen free
    }
    if (owned + g.free_count() != g.capacity()) {
      return broken(name + ": pages owned " + std::to_string(owned) + " + free " +
                    std::to_string(g.free_count()) + " != " + std::to_string(g.capacity()));
    }
    if (cached != g.cached_count() || !g.list_consistent()) {
      return broken(name + ": " + std::to_string(g.cached_count()) + " cached pages counted, " +
                    std::to_string(cached) + " recounted, or their list is broken");
    }
  }
  return ok_status();
}

}  // namespace core
}  // namespace pagedkv
