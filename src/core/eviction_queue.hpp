// Eviction queue of cached, unreferenced leaf blocks: lowest retention priority first, then least
// recently used (last-access tick), then id. The order is exactly that of an ordered set keyed
// by (priority, tick, id), but the structures are O(1) per operation in the common case:
//  * one intrusive doubly-linked list per retention priority (0..100), ascending tick, links
//    stored in BlockInfo, plus a bitmap of the non-empty priorities. A block released now has
//    the newest tick of all, so it is appended at the tail and each list stays sorted.
//  * a small indexed min-heap for the blocks that join out of tick order: a parent that becomes
//    a leaf when its last child goes, or a block whose retention expired. Such a block goes to
//    the head or tail of its list when its tick allows (the usual LRU chain case), else to the
//    heap; the front is the smaller of the lowest list head and the heap top.
// Retention expiry is a min-heap of deadlines, drained lazily before each decision (amortised
// O(log n) per expiring block). No call allocates once the heaps reached their peak size.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

#include "core/block_allocator.hpp"

namespace pagedkv {
namespace core {

/// Evictable blocks in (retention priority, last access, id) order plus the retention-expiry heap.
class EvictionQueue {
 public:
  /// Keys and links are read from (and expiry written to) `blocks`, which must outlive the queue.
  /// The queue holds blocks of one tier; a block's links serve whichever queue lists it.
  EvictionQueue(BlockAllocator* blocks, Tier tier) : blocks_(blocks), tier_(tier) {}

  /// Lists a block under its current (retention, last_access) key.
  void push(LogicalId id);
  /// Unlists a block (it must be listed).
  void erase(LogicalId id);
  /// The next victim, or kNoBlock when empty.
  LogicalId front() const;
  int64_t size() const { return size_; }
  /// The block listed after `id` in its priority list (the next victim when `id` is the front
  /// and the lists hold the order), or kNoBlock. A hint for prefetching, nothing more.
  LogicalId next_in_list(LogicalId id) const {
    const BlockInfo& b = (*blocks_)[id];
    return b.in_heap ? kNoBlock : b.q_next;
  }

  /// Registers the block's expiry deadline (when it has one and a non-default priority).
  void schedule_expiry(LogicalId id);
  /// Whether any expiry deadline is pending (avoids reading the clock when none is).
  bool has_deadlines() const { return !deadlines_.empty(); }
  /// Reverts the retention priority of every block whose deadline is <= now.
  void expire(int64_t now_ns);

  /// Whether `id` is listed in order under its current key (for invariant checks).
  bool contains(LogicalId id) const;

 private:
  static constexpr int kLevels = kMaxRetentionPriority - kMinRetentionPriority + 1;
  static constexpr int kWords = (kLevels + 63) / 64;
  using Deadline = std::tuple<int64_t, uint64_t, LogicalId>;  // (expiry, generation, id)

  struct List {
    LogicalId head = kNoBlock;
    LogicalId tail = kNoBlock;
  };

  // Strict (retention, last_access, id) order of two blocks.
  bool before(LogicalId a, LogicalId b) const;
  List& list_of(const BlockInfo& b) {
    return lists_[static_cast<size_t>(b.retention - kMinRetentionPriority)];
  }
  void link_head(LogicalId id);
  void link_tail(LogicalId id);
  void unlink(LogicalId id);
  void heap_push(LogicalId id);
  void heap_erase(LogicalId id);
  void heap_place(size_t pos, LogicalId id);
  void sift_up(size_t pos);
  void sift_down(size_t pos);

  BlockAllocator* blocks_;
  Tier tier_;
  int64_t size_ = 0;
  List lists_[kLevels];
  uint64_t nonempty_[kWords] = {};  // bit r: lists_[r] is not empty
  std::vector<LogicalId> heap_;     // out-of-order blocks; BlockInfo::q_prev is the position
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
};

}  // namespace core
}  // namespace pagedkv
