// Eviction queue of cached, unreferenced leaf blocks: lowest retention priority first, then least
// recently used. An ordered set keyed by (priority, last access tick, id) gives O(log n) push,
// erase and pop and handles blocks that become leaves late (a parent whose last child was
// evicted) at their true LRU position. Retention expiry is a min-heap of deadlines, drained
// lazily before each decision (amortised O(log n) per expiring block).
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <set>
#include <tuple>
#include <vector>

#include "core/block_allocator.hpp"

namespace pagedkv {
namespace core {

/// Ordered set of evictable blocks plus the retention-expiry heap.
class EvictionQueue {
 public:
  /// Keys are read from (and expiry written to) `blocks`, which must outlive the queue.
  explicit EvictionQueue(BlockAllocator* blocks) : blocks_(blocks) {}

  /// Lists a block under its current (retention, last_access) key.
  void push(LogicalId id);
  /// Unlists a block (it must be listed).
  void erase(LogicalId id);
  /// The next victim, or kNoBlock when empty.
  LogicalId front() const { return set_.empty() ? kNoBlock : std::get<2>(*set_.begin()); }
  int64_t size() const { return static_cast<int64_t>(set_.size()); }

  /// Registers the block's expiry deadline (when it has one and a non-default priority).
  void schedule_expiry(LogicalId id);
  /// Whether any expiry deadline is pending (avoids reading the clock when none is).
  bool has_deadlines() const { return !deadlines_.empty(); }
  /// Reverts the retention priority of every block whose deadline is <= now.
  void expire(int64_t now_ns);

  /// Whether `id` is in the set under its current key (for invariant checks).
  bool contains(LogicalId id) const;

 private:
  using Key = std::tuple<int32_t, uint64_t, LogicalId>;
  using Deadline = std::tuple<int64_t, uint64_t, LogicalId>;  // (expiry, generation, id)
  Key key_of(LogicalId id) const;

  BlockAllocator* blocks_;
  std::set<Key> set_;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
};

}  // namespace core
}  // namespace pagedkv
