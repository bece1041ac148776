// SharedGroups: the KV groups of a plane that share its logical blocks, other than the group
// that owns them (control_plane.hpp, "several KV groups"). It holds each group's pages
// (GroupPages) and what the plane's calls do to all of them at once: who holds a block's pages
// as a sequence's windows move, a new block's pages, a copy-on-write's copies, the pages that
// follow a block between tiers, a failed call's undo, and the groups' part of
// check_invariants(). The coordinator keeps one, empty for a one-group plane, as it keeps one
// TierStore per tier; it shares the block records, the journal and the event ring with it.
//
// A sequence holds the page of its block at table index i in window group w while i is at
// least its bound for w's window size (Sequence::window_bound; groups of one size share it); a
// commit moves that bound as the window moves. A group with no window has no bound: it holds a
// page for every block of its holders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/group_pages.hpp"
#include "core/journal.hpp"
#include "core/sequence_table.hpp"
#include "core/slot_origins.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv {
namespace core {

class SharedGroups {
 public:
  /// Where the groups' page events go: the page of the indexed block `b` in `g` was stored
  /// (cached from now on) or removed, on `tier`. The sink checks whether events are on before
  /// it reads anything (an eviction's records are cold).
  using PageEventSink = std::function<void(EventKind kind, LogicalId b, const GroupPages& g,
                                           Tier tier, bool revocable)>;

  /// Whether `config.groups` can share one plane, and which group owns the logical blocks (set
  /// in `*owner`): the one that attends furthest back, so that its blocks cover every other
  /// group's pages. That is a full-attention group (sliding_window 0; a latent group counts) or,
  /// when every group has a window, the widest; among equals the one with the most device blocks
  /// (the first of those), which bounds how many blocks every group can share. Any number of
  /// groups may have a window; a model of more than Sequence::kInlineWindowBounds window sizes
  /// besides the owner's keeps the further bounds out of the lines a decode step reads.
  static Status check_config(const CacheConfig& config, int32_t* owner);

  /// No groups (a one-group plane).
  SharedGroups() = default;
  /// Every group of `config` but `owner` (check_config()), over the logical blocks of `blocks`;
  /// undoable changes go to `journal`, page events to `events`. With `track_origins`, the slot
  /// origins of each group's moves are recorded (SlotOrigins, for the write-back of host drops).
  /// `blocks` and `journal` must outlive this.
  SharedGroups(const CacheConfig& config, int32_t owner, const BlockAllocator* blocks,
               Journal* journal, PageEventSink events, bool track_origins);

  // ---- the groups, by their index here (window_index(config group))

  bool empty() const { return pages_.empty(); }
  size_t size() const { return pages_.size(); }
  GroupPages& operator[](size_t w) { return pages_[w]; }
  const GroupPages& operator[](size_t w) const { return pages_[w]; }
  std::vector<GroupPages>::iterator begin() { return pages_.begin(); }
  std::vector<GroupPages>::iterator end() { return pages_.end(); }
  std::vector<GroupPages>::const_iterator begin() const { return pages_.begin(); }
  std::vector<GroupPages>::const_iterator end() const { return pages_.end(); }
  const std::vector<GroupPages>& pages() const { return pages_; }
  /// The index here of config group `g` (not the owner).
  size_t window_index(int32_t g) const { return static_cast<size_t>(g < owner_ ? g : g - 1); }
  /// Where group w's moves of the open call took each page's bytes from.
  const SlotOrigins& origins(size_t w) const { return origins_[w]; }
  /// A new tier-moving call: the slot origins start over.
  void begin_call() {
    for (SlotOrigins& o : origins_) o.begin_call();
  }

  // ---- holders: sequence `s` holds (or stops holding) block `b` at table index `i`; each
  // group whose window covers `i` counts it

  void hold(const Sequence& s, size_t i, LogicalId b);
  /// `undoable`: a drop the plan's undo takes back (journaled with the page it had).
  void drop(const Sequence& s, size_t i, LogicalId b, bool undoable = false);
  /// The logical block `b` (on tier `t`) is gone: its pages, which nobody holds, are freed.
  void release(LogicalId b, Tier t) {
    for (GroupPages& g : pages_) g.release(b, t);
  }
  /// A registration that finds the block `theirs` already indexed for `ours`, at index `i` of
  /// `s`: whether every group whose window covers `i` can serve it (theirs has a page, or only
  /// `s` holds ours', which theirs then takes over), and the swap of the holders there.
  bool can_swap(const Sequence& s, size_t i, LogicalId ours, LogicalId theirs) const;
  void swap(const Sequence& s, size_t i, LogicalId ours, LogicalId theirs);
  /// Whether a hit of `c` tokens over `found` finds every group's in-window pages.
  bool cover(const std::vector<LogicalId>& found, int64_t c) const;
  /// The bounds of a sequence of `length` committed tokens that holds its pages from there on.
  void set_first_held(Sequence* s, int64_t length) const;
  /// The bounds after a sequence's table was cut to `keep` entries.
  void clamp_first_held(Sequence* s, size_t keep) const;
  /// The groups drop the blocks that left their windows (a commit, never undone); returns how
  /// many pages they released.
  int64_t trim_windows(Sequence* s);
  /// kFailedPrecondition when rolling `s` back to `length` tokens needs pages a window released.
  Status check_rollback(const Sequence& s, int64_t length) const;

  // ---- pages of new, copied and moving blocks

  /// A new block's page in every group.
  void take(LogicalId b);
  /// The copies a copy-on-write from `src` to `dst` needs in every group.
  void copy(LogicalId src, LogicalId dst, Transfers* out) const;
  /// The pages of `b` follow it from tier `from` to `to` (moves named by group); a cached one is
  /// released instead when `to` has neither a free nor a cached page of that group.
  void move(LogicalId b, Tier from, Tier to, Transfers* out);
  /// The device pages group w gives up when `s` is offloaded: those it holds there of the device
  /// blocks only it references (the blocks an offload moves).
  int64_t offload_pages(const Sequence& s, size_t w) const;
  /// The device pages group w takes when the offloaded `s` is restored: the held pages of its
  /// blocks on the host, whoever holds them (a page another sequence's window covers moves with
  /// the block too; a cached one takes no room: it only replaces another cached page).
  int64_t restore_pages(const Sequence& s, size_t w) const;
  /// The device pages a reserve of `s` takes in each group, added to `*need`: `new_blocks`
  /// (the new blocks and a copy-on-write's copy), and restore_pages() when it is offloaded.
  void add_need(const Sequence& s, int64_t new_blocks, std::vector<int64_t>* need) const;
  /// A plan's undo of the journaled takes, drops and moves, adding the inverse of the moves
  /// among the first `moves_done` to `*inverse`.
  void undo(int64_t moves_done, std::vector<BlockMove>* inverse, std::vector<int32_t>* inverts);

  // ---- queries

  /// Group `g`'s (a config index, not the owner) pages of `s`'s table: -1 (on the device tier)
  /// for the blocks outside its window.
  std::vector<BlockLocation> block_locations(const Sequence& s, int32_t g) const;
  /// The reserved slots of `s` in group `g`'s pool (resident `s`).
  void reserved_slots(const Sequence& s, int32_t g, std::vector<int64_t>* out) const;
  /// Recounts every group's holders (the sequences' and `arriving`[w], the blocks whose pages in
  /// group w arrivals from a store hold), pages, free and cached pages; kInternal on a mismatch.
  Status check(const SequenceTable& seqs,
               const std::vector<std::vector<LogicalId>>& arriving) const;

 private:
  void page_event(EventKind kind, LogicalId b, const GroupPages& g, Tier tier = Tier::kDevice,
                  bool revocable = false) const {
    events_(kind, b, g, tier, revocable);
  }

  int32_t owner_ = 0;
  int64_t block_size_ = 1;
  BlockDivider bdiv_{1};
  const BlockAllocator* blocks_ = nullptr;
  Journal* journal_ = nullptr;
  PageEventSink events_;
  std::vector<GroupPages> pages_;
  std::vector<SlotOrigins> origins_;  // per group, when origins are tracked
};

}  // namespace core
}  // namespace pagedkv
