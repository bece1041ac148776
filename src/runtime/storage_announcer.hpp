// StorageAnnouncer: which blocks written back to a storage tier are announced on it
// (kBlockStored on Tier::kStorage), and when.
//
// Routers build a prefix tree from the events, so a block announced on the storage tier must name
// a parent they know (on any tier; the first block of a prompt has none), and is announced once.
// Puts finish in any order, and the host LRU drops leaves first, so a child's put often finishes
// before its parent's, or after the parent left the host tier. A block whose parent is neither
// held by the in-process tiers nor announced on storage waits for the parent's put, when one is
// in flight, and is announced right after it; otherwise it is not announced at all (a fetch
// cannot reach it either: lookups walk from the cached prefix, and the store's stop at the first
// missing block).
//
// A block is announced once for the life of the cache, also when it is written back again later
// (after a fetch brought it back): the store's own removals are not reported, so a router's view
// of the storage tier is an upper bound, and a block it names may be a miss. The set of announced
// keys grows with the distinct blocks written back (about 50 bytes each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pagedkv/control_types.hpp"
#include "pagedkv/storage_tier.hpp"

namespace pagedkv {
namespace runtime {

struct StorageKeyHash {
  size_t operator()(const StorageKey& k) const {
    return static_cast<size_t>(k.block_hash ^
                               (static_cast<uint64_t>(k.ns) * 0x9e3779b97f4a7c15ULL));
  }
};

class StorageAnnouncer {
 public:
  /// A put of `block` was handed to the staging area (it is in flight until put_ended()).
  void put_started(const DroppedBlock& block) { ++in_flight_[key(block)]; }
  /// The put of `block` finished, failed or was given up; `stored`: the store now holds it.
  /// Takes effect at the next announce().
  void put_ended(DroppedBlock block, bool stored) {
    ended_.push_back(key(block));
    if (stored) stored_.push_back(std::move(block));
  }

  /// Decides what the ended puts announce: calls `emit(block)` for each block to announce now,
  /// parents before children. `held(hash)`: whether the in-process tiers index a block of that
  /// chained hash (a router knows it); `root(ns)`: the hash a prompt's first block names as its
  /// parent.
  template <typename Held, typename Root, typename Emit>
  void announce(Held held, Root root, Emit emit) {
    std::vector<DroppedBlock> work;
    work.swap(stored_);
    // First with every finished put still in flight, so a child that finished with its parent
    // waits for it instead of being given up.
    settle(work, held, root, emit);
    for (const StorageKey& k : ended_) {
      auto it = in_flight_.find(k);
      if (it != in_flight_.end() && --it->second == 0) in_flight_.erase(it);
    }
    ended_.clear();
    // Blocks waiting for a parent whose put is over: announced now if the parent is known,
    // given up otherwise.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (in_flight_.count(it->first) != 0) {
        ++it;
        continue;
      }
      for (DroppedBlock& b : it->second) work.push_back(std::move(b));
      it = waiting_.erase(it);
    }
    settle(work, held, root, emit);
  }

  /// Blocks waiting for a parent's put (tests).
  size_t waiting() const {
    size_t n = 0;
    for (const auto& w : waiting_) n += w.second.size();
    return n;
  }

 private:
  static StorageKey key(const DroppedBlock& b) { return StorageKey{b.block_hash, b.ns}; }

  template <typename Held, typename Root, typename Emit>
  void settle(std::vector<DroppedBlock>& work, Held& held, Root& root, Emit& emit) {
    while (!work.empty()) {
      DroppedBlock b = std::move(work.back());
      work.pop_back();
      const StorageKey k = key(b);
      if (announced_.count(k) != 0) continue;  // once per block
      const StorageKey parent{b.parent_hash, b.ns};
      if (b.parent_hash == root(b.ns) || announced_.count(parent) != 0 || held(b.parent_hash)) {
        emit(b);
        announced_.insert(k);
        auto children = waiting_.find(k);
        if (children != waiting_.end()) {
          for (DroppedBlock& c : children->second) work.push_back(std::move(c));
          waiting_.erase(children);
        }
      } else if (in_flight_.count(parent) != 0) {
        waiting_[parent].push_back(std::move(b));
      }
    }
  }

  std::unordered_set<StorageKey, StorageKeyHash> announced_;
  std::unordered_map<StorageKey, int64_t, StorageKeyHash> in_flight_;  // puts per key
  std::unordered_map<StorageKey, std::vector<DroppedBlock>, StorageKeyHash> waiting_;  // by parent
  std::vector<StorageKey> ended_;
  std::vector<DroppedBlock> stored_;
};

}  // namespace runtime
}  // namespace pagedkv
