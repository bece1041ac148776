// What a storage tier's blocks need on their way back into a control plane: the lookup of a
// prompt's blocks a store may hold (ControlPlane::storage_lookup) and the host slots and pages
// taken for the blocks that come back (ControlPlane::begin_arrival; storage_arrivals.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/prefix_index.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

/// The full blocks of a prompt that a storage tier may hold (ControlPlane::storage_lookup): for
/// full attention those after the longest prefix the index holds; for a sliding window the
/// missing ones among those the window of the longest hit needs.
struct StorageLookup {
  NamespaceId ns = 0;
  NodeId parent = kRootNode;     // the index node they continue (kRootNode: from the start)
  uint64_t parent_hash = 0;      // its chained hash, to check it is still the same node
  std::vector<uint64_t> hashes;  // chained hash of each block, in prompt order
  std::vector<TokenId> tokens;   // their tokens, block after block
  /// Sliding window only: the chained hash of the prefix before each block, the key of its flat
  /// node (the blocks need not be contiguous, and none continues `parent`). Empty otherwise.
  std::vector<uint64_t> prefix_hashes;
  /// The longest hit (tokens, within the lookup's bound) the prompt reaches with the blocks the
  /// index holds now; and once every listed block has arrived (nothing evicted meanwhile).
  /// ControlPlane::storage_reach() gives it for the first n listed blocks.
  int64_t cached_reach = 0;
  int64_t reach = 0;
  // What storage_reach() needs: the prompt's length, the bound, and (full attention) the blocks
  // the index held before the listed ones.
  int64_t prompt_length = 0;
  int64_t cap = 0;
  int64_t first_block = 0;
  // Several groups: the blocks the index held before the listed ones (their groups' pages count
  // toward a hit); in a window cache, at every table index up to the hit's end (kNoBlock where
  // it held none), with the table index of each listed block in `listed_at`.
  std::vector<LogicalId> found;
  std::vector<int64_t> listed_at;
};

/// One group's pages of an arrival, in a plane of several groups: block `index[k]` of the
/// arrival gets host page `pages[k]` of group `group` (a config index).
struct GroupArrival {
  int32_t group = 0;
  std::vector<int32_t> index;
  std::vector<int32_t> pages;
};

/// Host slots taken for blocks coming back from a store (ControlPlane::begin_arrival).
struct Arrival {
  uint64_t id = 0;
  std::vector<int32_t> host_blocks;  // physical host ids, for the first host_blocks.size() blocks
  /// Several groups: the other groups' host pages the store reads into.
  std::vector<GroupArrival> groups;
  /// The longest prefix hit, in tokens, once every block and page has landed (none evicted
  /// meanwhile); the lookup's cached_reach when nothing is taken.
  int64_t reach = 0;
  /// Cached host blocks dropped to free those slots (reported with report_host_drops): their
  /// bytes are in their slots until the store's read overwrites them, so a write-back copies
  /// them out before the read is submitted.
  std::vector<DroppedBlock> host_drops;
};

}  // namespace core
}  // namespace pagedkv
