// Block allocator: logical blocks (identity of a block, what sequences and the prefix index point
// to) kept apart from physical slots (where the bytes are, per tier). O(1) allocate/free/move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/huge_pages.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

/// Index of a logical block; stable while the block moves between tiers.
using LogicalId = int32_t;
inline constexpr LogicalId kNoBlock = -1;

/// Division of non-negative positions by the block size: a shift and a mask when the size is a
/// power of two (the usual case), because a 64-bit idiv per token costs more than the rest of a
/// decode step's per-sequence work.
class BlockDivider {
 public:
  explicit BlockDivider(int64_t block_size) : size_(block_size) {
    if (block_size > 0 && (block_size & (block_size - 1)) == 0) {
      shift_ = 0;
      while ((int64_t{1} << shift_) < block_size) ++shift_;
    }
  }
  /// The block holding position `p`.
  int64_t div(int64_t p) const { return shift_ >= 0 ? p >> shift_ : p / size_; }
  /// The offset of position `p` in its block.
  int64_t mod(int64_t p) const { return shift_ >= 0 ? p & (size_ - 1) : p % size_; }
  /// Blocks covering `p` tokens.
  int64_t ceil_div(int64_t p) const { return div(p + size_ - 1); }

 private:
  int64_t size_;
  int shift_ = -1;
};

/// Everything the control plane knows about one logical block. One cache line, aligned to one:
/// an eviction reads and writes most of a record, and a record split over two lines costs two
/// misses where the blocks do not fit the cache.
struct alignas(64) BlockInfo {
  Tier tier = Tier::kDevice;
  bool listed = false;   // in the eviction queue
  bool in_heap = false;  // listed in the queue's out-of-order heap, not in a priority list
  int32_t phys = -1;     // physical slot in `tier`; -1 when the logical id is free
  int32_t ref = 0;       // sequences holding it (a sequence holds each of its blocks once)
  int32_t node = -1;     // prefix-index node when cached (registered), else -1
  // Registered blocks: how many child nodes are device-resident. A cached device block is
  // evictable once it has none (its host-resident children do not pin it).
  int32_t device_children = 0;
  // Eviction key while unreferenced: retention priority, then last access tick.
  int32_t retention = kDefaultRetentionPriority;
  // Intrusive links of the eviction queue, kept here so that an eviction touches one record:
  // neighbours in the priority list, or (prev only) the position in the heap.
  int32_t q_prev = -1;
  int32_t q_next = -1;
  int64_t expiry_ns = 0;     // when `retention` reverts to default; 0: never
  uint64_t expiry_gen = 0;   // invalidates stale entries of the expiry heap
  uint64_t last_access = 0;  // monotone tick of the last reference or release
};
static_assert(sizeof(BlockInfo) == 64, "a block record is one cache line");

/// Logical blocks plus one free stack of physical slots per tier.
class BlockAllocator {
 public:
  /// Pools of `device_blocks` and `host_blocks` physical slots (both validated by the caller).
  BlockAllocator(int64_t device_blocks, int64_t host_blocks);

  /// Physical slots of a tier.
  int64_t capacity(Tier t) const { return static_cast<int64_t>(owner_[idx(t)].size()); }
  /// Free physical slots of a tier.
  int64_t free_count(Tier t) const { return static_cast<int64_t>(free_[idx(t)].size()); }

  /// Takes the next free slot of `t` (lowest id first on a fresh pool, then LIFO) and a logical
  /// id for it, with ref = 1. Requires free_count(t) > 0.
  LogicalId allocate(Tier t);
  /// Returns the block's physical slot and logical id to their free stacks. Requires ref == 0 and
  /// no prefix-index node.
  void release(LogicalId id);
  /// Moves a block to a free slot of `dst`; returns the move (physical ids). Requires a free slot.
  BlockMove move(LogicalId id, Tier dst);
  /// Moves a block back to the free physical slot `phys` of `dst` (undoing a move). O(free slots).
  void move_to(LogicalId id, Tier dst, int32_t phys);
  /// Takes the free logical id `id` and free slot `phys` of `t` again, with ref = 1 (undoing a
  /// release). O(free slots).
  void reacquire(LogicalId id, Tier t, int32_t phys);

  BlockInfo& operator[](LogicalId id) { return blocks_[static_cast<size_t>(id)]; }
  const BlockInfo& operator[](LogicalId id) const { return blocks_[static_cast<size_t>(id)]; }
  /// Logical ids range over [0, num_logical()).
  int64_t num_logical() const { return static_cast<int64_t>(blocks_.size()); }
  /// The logical block in physical slot `phys` of `t`, or kNoBlock when the slot is free.
  LogicalId owner(Tier t, int32_t phys) const { return owner_[idx(t)][static_cast<size_t>(phys)]; }
  /// Whether a logical id is in use.
  bool live(LogicalId id) const { return blocks_[static_cast<size_t>(id)].phys >= 0; }

 private:
  static size_t idx(Tier t) { return static_cast<size_t>(t); }
  int32_t take_slot(Tier t);

  HugeVector<BlockInfo> blocks_;
  std::vector<LogicalId> free_logical_;
  std::vector<int32_t> free_[kNumTiers];
  std::vector<LogicalId> owner_[kNumTiers];
};

}  // namespace core
}  // namespace pagedkv
