#include "core/block_allocator.hpp"

#include <algorithm>
#include <cassert>

#include "core/huge_pages.hpp"

namespace pagedkv {
namespace core {

BlockAllocator::BlockAllocator(int64_t device_blocks, int64_t host_blocks) {
  const int64_t counts[kNumTiers] = {device_blocks, host_blocks};
  for (int t = 0; t < kNumTiers; ++t) {
    owner_[t].assign(static_cast<size_t>(counts[t]), kNoBlock);
    // Descending, so that pops hand out 0, 1, 2, ... on a fresh pool (predictable ids).
    free_[t].reserve(static_cast<size_t>(counts[t]));
    for (int64_t i = counts[t] - 1; i >= 0; --i) free_[t].push_back(static_cast<int32_t>(i));
  }
  // A logical block exists per occupied physical slot, so this many ids always suffice.
  const int64_t logical = device_blocks + host_blocks;
  resize_huge(&blocks_, static_cast<size_t>(logical));
  free_logical_.reserve(static_cast<size_t>(logical));
  for (int64_t i = logical - 1; i >= 0; --i) free_logical_.push_back(static_cast<LogicalId>(i));
}

int32_t BlockAllocator::take_slot(Tier t) {
  auto& f = free_[idx(t)];
  assert(!f.empty());
  const int32_t phys = f.back();
  f.pop_back();
  return phys;
}

LogicalId BlockAllocator::allocate(Tier t) {
  assert(!free_logical_.empty());
  const LogicalId id = free_logical_.back();
  free_logical_.pop_back();
  const int32_t phys = take_slot(t);
  BlockInfo& b = blocks_[static_cast<size_t>(id)];
  b = BlockInfo();
  b.tier = t;
  b.phys = phys;
  b.ref = 1;
  owner_[idx(t)][static_cast<size_t>(phys)] = id;
  return id;
}

void BlockAllocator::release(LogicalId id) {
  BlockInfo& b = blocks_[static_cast<size_t>(id)];
  assert(b.phys >= 0 && b.ref == 0 && b.node < 0 && !b.listed);
  owner_[idx(b.tier)][static_cast<size_t>(b.phys)] = kNoBlock;
  free_[idx(b.tier)].push_back(b.phys);
  b.phys = -1;
  ++b.expiry_gen;  // any pending expiry entry of this id is now stale
  free_logical_.push_back(id);
}

BlockMove BlockAllocator::move(LogicalId id, Tier dst) {
  BlockInfo& b = blocks_[static_cast<size_t>(id)];
  assert(b.phys >= 0 && b.tier != dst);
  BlockMove m;
  m.src_tier = b.tier;
  m.src_block = b.phys;
  m.dst_tier = dst;
  m.dst_block = take_slot(dst);
  owner_[idx(b.tier)][static_cast<size_t>(b.phys)] = kNoBlock;
  free_[idx(b.tier)].push_back(b.phys);
  owner_[idx(dst)][static_cast<size_t>(m.dst_block)] = id;
  b.tier = dst;
  b.phys = m.dst_block;
  return m;
}

void BlockAllocator::move_to(LogicalId id, Tier dst, int32_t phys) {
  BlockInfo& b = blocks_[static_cast<size_t>(id)];
  assert(b.phys >= 0 && b.tier != dst);
  auto& f = free_[idx(dst)];
  auto it = std::find(f.begin(), f.end(), phys);
  assert(it != f.end());
  f.erase(it);
  owner_[idx(b.tier)][static_cast<size_t>(b.phys)] = kNoBlock;
  free_[idx(b.tier)].push_back(b.phys);
  owner_[idx(dst)][static_cast<size_t>(phys)] = id;
  b.tier = dst;
  b.phys = phys;
}

void BlockAllocator::reacquire(LogicalId id, Tier t, int32_t phys) {
  auto logical = std::find(free_logical_.begin(), free_logical_.end(), id);
  auto& f = free_[idx(t)];
  auto slot = std::find(f.begin(), f.end(), phys);
  assert(logical != free_logical_.end() && slot != f.end());
  free_logical_.erase(logical);
  f.erase(slot);
  BlockInfo& b = blocks_[static_cast<size_t>(id)];
  const uint64_t expiry_gen = b.expiry_gen;
  b = BlockInfo();
  b.expiry_gen = expiry_gen;
  b.tier = t;
  b.phys = phys;
  b.ref = 1;
  owner_[idx(t)][static_cast<size_t>(phys)] = id;
}

}  // namespace core
}  // namespace pagedkv
