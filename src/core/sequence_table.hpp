// Sequence table: the state of each sequence (committed tokens, block table, reservation,
// priority, activity, residency) and the ordered set of victim candidates (inactive, resident
// sequences keyed by (priority, order tick)) that the planner takes from in O(log n).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/block_allocator.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

/// One sequence. Cache-line aligned, with what a decode step reads (reserve, build, commit)
/// in the first two lines (the window groups' bounds and the flags share the padding after
/// first_live; batch_mark, read when a batch is resolved anew, starts the third).
struct alignas(64) Sequence {
  std::vector<TokenId> tokens;    // committed tokens
  std::vector<LogicalId> blocks;  // logical block table, covers committed + pending tokens
  // Blocks [0, first_live) fell out of the sliding window: kNoBlock (always 0 without one).
  size_t first_live = 0;
  // A plane with window groups sharing the blocks (GroupPages): per window size, the first
  // table index whose page the sequence holds in the groups of that window (window_bound();
  // groups with no window need no bound). The first kInlineWindowBounds sizes' bounds are here,
  // in the lines a decode step reads; a model of more sizes keeps the rest in more_bounds.
  static constexpr int32_t kInlineWindowBounds = 3;
  uint32_t group_first_live[kInlineWindowBounds] = {};
  bool active = false;
  bool offloaded = false;
  bool is_victim = false;      // in the victim set
  int64_t pending = 0;         // reserved, not yet committed tokens
  uint64_t last_used = 0;      // tick of the last reserve/commit/add (LRU)
  uint64_t arrival = 0;        // unique, increasing: real arrival order (FIFO)
  uint64_t table_version = 0;  // bumped whenever an existing table entry changes
  // Entries [0, changed_from) are the same at every table version in [base_version,
  // table_version], so a batch row built at such a version only rewrites from there. The one
  // change without a version: a sliding window turning its first entries into kNoBlock
  // (first_live grows), which rows track themselves.
  uint64_t base_version = 0;
  size_t changed_from = SIZE_MAX;
  SequenceId id = 0;
  uint64_t batch_mark = 0;  // duplicate detection in build_batch
  SequenceOptions options;
  std::tuple<int32_t, uint64_t, SequenceId> victim_key{};
  std::vector<uint32_t> more_bounds;  // window bounds past the inline ones (empty: all 0)

  /// The bound of window size `slot` (GroupPages::first_held).
  uint32_t window_bound(int32_t slot) const {
    if (slot < kInlineWindowBounds) return group_first_live[slot];
    const size_t i = static_cast<size_t>(slot - kInlineWindowBounds);
    return i < more_bounds.size() ? more_bounds[i] : 0;
  }
  void set_window_bound(int32_t slot, uint32_t first) {
    if (slot < kInlineWindowBounds) {
      group_first_live[slot] = first;
      return;
    }
    const size_t i = static_cast<size_t>(slot - kInlineWindowBounds);
    if (i >= more_bounds.size()) more_bounds.resize(i + 1, 0);
    more_bounds[i] = first;
  }

  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
  /// The blocks the sequence holds: its table without the entries that fell out of the window.
  struct LiveBlocks {
    const LogicalId* first;
    const LogicalId* last;
    const LogicalId* begin() const { return first; }
    const LogicalId* end() const { return last; }
  };
  LiveBlocks live_blocks() const {
    return LiveBlocks{blocks.data() + first_live, blocks.data() + blocks.size()};
  }
  /// Records a change of the table entries from index `from` on (a new table version).
  void mark_changed(size_t from) {
    ++table_version;
    if (from < changed_from) changed_from = from;
  }
};

/// Sequences by id plus the victim set.
class SequenceTable {
 public:
  using VictimKey = std::tuple<int32_t, uint64_t, SequenceId>;

  /// The sequence with this id, or nullptr.
  Sequence* find(SequenceId id) {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : it->second.get();
  }
  const Sequence* find(SequenceId id) const {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : it->second.get();
  }
  /// Creates a sequence (the id must be new).
  Sequence* create(SequenceId id);
  /// Destroys a sequence (it must not be a victim any more).
  void destroy(SequenceId id);
  int64_t size() const { return static_cast<int64_t>(map_.size()); }
  /// Bumped by every destroy(): a Sequence* resolved while it was unchanged is still valid.
  uint64_t generation() const { return generation_; }

  /// Puts the sequence in the victim set under `key`, or re-keys it.
  void set_victim(Sequence* s, const VictimKey& key);
  /// Takes the sequence out of the victim set (no-op when absent).
  void clear_victim(Sequence* s);
  const std::set<VictimKey>& victims() const { return victims_; }

  /// All sequences (for invariant checks and stats).
  const std::unordered_map<SequenceId, std::unique_ptr<Sequence>>& all() const { return map_; }

 private:
  std::unordered_map<SequenceId, std::unique_ptr<Sequence>> map_;
  std::set<VictimKey> victims_;
  uint64_t generation_ = 0;
};

}  // namespace core
}  // namespace pagedkv
