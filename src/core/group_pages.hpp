// The pages of one KV group in a control plane whose groups share the logical blocks
// (control_plane.hpp, "several KV groups"), other than the group that owns them. The plane's
// logical block table is the owner's (a full-attention group); every other group keeps a page of
// its own pool for the blocks some holder still attends to, plus cached pages a later prefix hit
// can reuse. A sliding-window group holds only the pages inside its holders' windows; a group
// with no window (another full-attention or an MLA latent group) holds a page for every block of
// its holders and never trims.
//
// Per logical block: the page (or -1) and the holders that need it (sequences holding the block
// at a table index inside their window). A page nobody needs stays while its block is in the
// prefix index (cached, in the pool of the tier its block is on, listed per tier least recently
// cached first, evicted page by page when that pool runs dry) and is freed at once otherwise. A
// cached page follows its block between tiers when the other tier has room for it, so a prefix
// hit on a block the host tier keeps finds every group's pages. O(1) per operation; no
// allocation after construction. Which block owns a page is not kept: only check_invariants()
// asks, and it recounts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/sequence_table.hpp"

namespace pagedkv {
namespace core {

class GroupPages {
 public:
  /// `window` tokens (0: none), pools of `device_pages` and `host_pages`, logical ids in
  /// [0, num_logical). A window group keeps its holders' bounds in their
  /// Sequence::window_bound(`live_slot`), shared by the groups of its window size (-1 without
  /// a window: the bound is always 0).
  GroupPages(int32_t config_index, int64_t window, int32_t live_slot, int64_t block_size,
             int64_t device_pages, int64_t host_pages, int64_t num_logical);

  /// The group's index in CacheConfig::groups.
  int32_t config_index() const { return config_index_; }
  /// Tokens of the sliding window; 0 for a group with none.
  int64_t window() const { return window_; }
  /// The first table index a sequence of `length` committed tokens still attends to.
  size_t first_block(int64_t length) const {
    return window_ == 0 ? 0
                        : static_cast<size_t>(bdiv_.div(std::max<int64_t>(0, length - window_)));
  }
  /// The first table index whose page sequence `s` holds here.
  size_t first_held(const Sequence& s) const {
    return live_slot_ < 0 ? 0 : s.window_bound(live_slot_);
  }
  /// Sets that bound, for every group of this window size (a group with no window has none to
  /// set: it is always 0).
  void set_first_held(Sequence* s, size_t first) const {
    if (live_slot_ >= 0) s->set_window_bound(live_slot_, static_cast<uint32_t>(first));
  }

  /// The page of logical block `b` (in the pool of the tier the block is on), or -1.
  int32_t page(LogicalId b) const { return rec_[static_cast<size_t>(b)].page; }
  /// Fetches the record of `b` into the cache, ahead of a call that changes it.
  void prefetch(LogicalId b) const { __builtin_prefetch(&rec_[static_cast<size_t>(b)], 1); }
  /// Holders that need the page of `b`.
  int32_t holders(LogicalId b) const { return rec_[static_cast<size_t>(b)].holders; }
  /// Whether the page of `b` is cached: kept with no holder (its block is indexed), listed for
  /// eviction in the tier its block is on.
  bool cached(LogicalId b) const {
    const Record& r = rec_[static_cast<size_t>(b)];
    return r.page >= 0 && r.holders == 0;
  }
  int64_t capacity(Tier t = Tier::kDevice) const { return num_pages_[idx(t)]; }
  int64_t free_count(Tier t = Tier::kDevice) const {
    return static_cast<int64_t>(free_[idx(t)].size());
  }
  /// The free pages of a tier (for invariant checks).
  const std::vector<int32_t>& free_pages(Tier t) const { return free_[idx(t)]; }
  /// Cached pages in tier `t`'s pool.
  int64_t cached_count(Tier t = Tier::kDevice) const { return cached_[idx(t)]; }
  /// Pages of tier `t` a reserve or a move can have: free or cached.
  int64_t room(Tier t = Tier::kDevice) const { return free_count(t) + cached_[idx(t)]; }
  /// Cached pages evicted so far (on either tier).
  int64_t evicted() const { return evicted_; }
  /// Pages released as they fell out of a window so far (count_released()).
  int64_t released() const { return released_; }
  /// Counts `n` pages the plane released as they fell out of their holders' windows (a commit,
  /// which is never undone).
  void count_released(int64_t n) { released_ += n; }
  /// Whether each tier's cached list, walked from its head, holds exactly that tier's cached
  /// pages in order (for invariant checks). O(cached pages).
  bool list_consistent() const;

  /// Gives logical block `b`, new on tier `t` (the device, or the host for a block arriving from
  /// a store), a page there with one holder, evicting the least recently cached page of that
  /// tier when none is free; returns the block whose page it evicted, or kNoBlock. Requires
  /// room(t) > 0 and no page for `b`.
  LogicalId take(LogicalId b, Tier t = Tier::kDevice);
  /// One more holder of `b`'s page (which must exist, in tier `t`, its block's); a cached page
  /// is no longer cached.
  void hold(LogicalId b, Tier t);
  /// One holder fewer. The last one leaves the page cached in tier `t` when `cacheable` (the
  /// block is indexed), else frees it into tier `t`'s pool.
  void drop(LogicalId b, bool cacheable, Tier t);
  /// Hands the page of `from`, held by one holder, to `to`, which has none, with that holder:
  /// two blocks of the same tokens after the same prefix hold the same keys and values.
  void adopt(LogicalId from, LogicalId to);
  /// The page of `b`, held or cached, follows its block from tier `from` to `to`: a page there
  /// is taken (a free one, else the least recently cached one is evicted: `*evicted` its
  /// block, or kNoBlock), the old one freed; a cached page is listed in `to` as the most
  /// recently cached. Returns the new page. Requires room(to) > 0.
  int32_t move(LogicalId b, Tier from, Tier to, LogicalId* evicted);
  /// Undoes move(): `b`'s page, now in tier `now`, goes back to the free page `page` of `to`.
  void move_back(LogicalId b, Tier now, Tier to, int32_t page);
  /// Undoes take(b): its page is free again (the page it evicted, if any, stays evicted).
  void untake(LogicalId b);
  /// Undoes drop(b): the hold comes back, on `page` of tier `t`, which must be b's or free.
  void undrop(LogicalId b, int32_t page, Tier t);
  /// The logical block `b`, on tier `t`, is gone: its page, if any, is freed (it has no holder).
  void release(LogicalId b, Tier t);
  /// The cached page of `b`, on tier `t`, is evicted (freed and counted in evicted()), as a
  /// failed call's undo gives up a cached page it moved (docs/tiers.md, "Failure rules").
  void evict(LogicalId b, Tier t) {
    release(b, t);
    ++evicted_;
  }

 private:
  // One record per logical block, so that an eviction touches the victim's line and the
  // next victim's (the list links) and nothing else.
  struct Record {
    int32_t page = -1;
    int32_t holders = 0;
    LogicalId prev = kNoBlock;  // its tier's cached list, least recently cached first
    LogicalId next = kNoBlock;
  };
  static size_t idx(Tier t) { return static_cast<size_t>(t); }
  void link_tail(LogicalId b, Tier t);
  void unlink(LogicalId b, Tier t);
  // A free page of tier `t`, evicting the least recently cached one there when none is free.
  int32_t take_page(Tier t, LogicalId* evicted);
  // Takes the free page `page` of tier `t` out of its free stack. O(free pages).
  void reclaim(Tier t, int32_t page);

  int32_t config_index_;
  int64_t window_;
  int32_t live_slot_;
  BlockDivider bdiv_;
  int64_t num_pages_[kNumTiers];
  std::vector<Record> rec_;  // by logical id
  LogicalId head_[kNumTiers] = {kNoBlock, kNoBlock};
  LogicalId tail_[kNumTiers] = {kNoBlock, kNoBlock};
  int64_t cached_[kNumTiers] = {0, 0};
  int64_t evicted_ = 0;
  int64_t released_ = 0;
  std::vector<int32_t> free_[kNumTiers];
};

}  // namespace core
}  // namespace pagedkv
