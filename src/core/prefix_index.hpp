// Prefix index: a radix tree over full blocks. A node's key is (parent node, namespace, the
// block's token ids); each node carries a chained 64-bit hash of its whole prefix. Children are
// found through one hash map keyed by that chained hash (collisions resolved by comparing the
// key), so lookup, insert and remove are O(block_size) expected. The map is a flat open-addressing
// table (linear probing, backward-shift deletion, load <= 1/2) sized once for every node, so a
// lookup at a million cached blocks costs one cache miss and nothing allocates.
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/huge_pages.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv {
namespace core {

/// Index of a node of the prefix index.
using NodeId = int32_t;
/// The parent of first blocks (the root of every namespace).
inline constexpr NodeId kRootNode = -1;

/// One cached block in the tree.
struct PrefixNode {
  NodeId parent = kRootNode;
  LogicalId block = kNoBlock;
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  NamespaceId ns = 0;
  int32_t children = 0;
  NodeId next_same_hash = -1;  // collision chain in the hash map
  NodeId newest_child = -1;    // the child inserted last, if still there: match()'s first guess
  bool live = false;
};

/// Radix tree of full blocks with chained hashes.
class PrefixIndex {
 public:
  /// `max_nodes` bounds the number of live nodes (one per logical block).
  PrefixIndex(int32_t block_size, int64_t max_nodes);

  /// Hash of the empty prefix of a namespace.
  static uint64_t root_hash(NamespaceId ns);
  /// Chained hash of a block after a prefix whose hash is `parent_hash` (docs/events.md).
  uint64_t chain_hash(uint64_t parent_hash, const TokenId* tokens) const;
  /// Hash of the prefix ending at `parent` (root_hash(ns) for kRootNode).
  uint64_t prefix_hash(NodeId parent, NamespaceId ns) const {
    return parent == kRootNode ? root_hash(ns) : nodes_[static_cast<size_t>(parent)].hash;
  }

  /// The child of `parent` holding `tokens` (block_size ids) in namespace `ns`, or -1.
  NodeId find(NodeId parent, NamespaceId ns, const TokenId* tokens) const;
  /// Follows the tree from the root of `ns` along the first `n` blocks of `tokens` (n x
  /// block_size ids) and appends the block of each node found to `blocks`, up to the first miss.
  /// The same as find() block by block.
  void match(NamespaceId ns, const TokenId* tokens, int64_t n,
             std::vector<LogicalId>* blocks) const;
  /// Adds a child (which must not exist) for `block`; returns its id.
  NodeId insert(NodeId parent, NamespaceId ns, const TokenId* tokens, LogicalId block);
  /// Where a key is, or would go: the node holding it (or -1) with the key's chained hash and
  /// hash-map slot, so that inserting a key a lookup did not find computes neither again.
  struct Lookup {
    NodeId found = -1;
    NodeId parent = kRootNode;
    uint64_t parent_hash = 0;
    NamespaceId ns = 0;
    const TokenId* tokens = nullptr;  // the caller's block_size ids, read again by insert()
    uint64_t hash = 0;
    size_t slot = 0;
    uint64_t changes = 0;  // the index's change count when looked up
  };
  /// find() answering with the Lookup.
  Lookup lookup(NodeId parent, NamespaceId ns, const TokenId* tokens) const {
    return lookup_hashed(parent, prefix_hash(parent, ns), ns, tokens);
  }
  /// lookup() (or, with kRootNode, lookup_flat()) of a key whose chained hash the caller has
  /// computed already: `hash` must be chain_hash(parent_hash, tokens).
  Lookup lookup_known(NodeId parent, uint64_t parent_hash, uint64_t hash, NamespaceId ns,
                      const TokenId* tokens) const;
  /// Adds the key of a lookup (lookup() or lookup_flat()) that found nothing, for `block`, with
  /// nothing inserted or removed since (asserted); returns its id. The same as insert() or
  /// insert_flat() of the key.
  NodeId insert(const Lookup& missing, LogicalId block);

  // Flat nodes (sliding-window caches): a node per block keyed by the chained hash of the prefix
  // before it, with no parent node, so that any block can be evicted on its own while the blocks
  // after it stay cached (a window needs only the last blocks of a prefix). Their parent is
  // kRootNode and their parent_hash whatever prefix they continue.

  /// The flat node holding `tokens` after the prefix whose chained hash is `parent_hash`, or -1.
  NodeId find_flat(uint64_t parent_hash, NamespaceId ns, const TokenId* tokens) const;
  /// find_flat() answering with the Lookup.
  Lookup lookup_flat(uint64_t parent_hash, NamespaceId ns, const TokenId* tokens) const {
    return lookup_hashed(kRootNode, parent_hash, ns, tokens);
  }
  /// Adds a flat node (which must not exist) for `block`; returns its id.
  NodeId insert_flat(uint64_t parent_hash, NamespaceId ns, const TokenId* tokens, LogicalId block);
  /// Removes a leaf.
  void remove(NodeId node);
  /// Whether a node of chained hash `hash` is indexed.
  bool contains_hash(uint64_t hash) const { return slots_[probe(hash)].node >= 0; }
  /// Prefetch hints for a coming remove(): the node's record, and (once that has arrived) the
  /// hash-map slot its hash lives in.
  void prefetch_node(NodeId n) const { __builtin_prefetch(&nodes_[static_cast<size_t>(n)]); }
  void prefetch_slot(NodeId n) const {
    __builtin_prefetch(&slots_[nodes_[static_cast<size_t>(n)].hash & mask_]);
  }

  /// Prefetch hint for a coming lookup_known() of a key whose chained hash is `hash`: the
  /// hash-map slot its probe starts at.
  void prefetch_hash(uint64_t hash) const { __builtin_prefetch(&slots_[hash & mask_]); }

  const PrefixNode& node(NodeId n) const { return nodes_[static_cast<size_t>(n)]; }
  /// The block_size token ids of a node.
  const TokenId* tokens(NodeId n) const {
    return &tokens_[static_cast<size_t>(n) * static_cast<size_t>(block_size_)];
  }
  /// Node ids range over [0, capacity()); check node(n).live.
  int64_t capacity() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t size() const { return size_; }
  /// Whether the hash map reaches `n` (for invariant checks).
  bool reachable(NodeId n) const;

 private:
  // chain_hash() without the parent: the order-dependent sum of the block's words.
  uint64_t block_digest(const TokenId* tokens) const;
  bool same_key(NodeId n, NodeId parent, uint64_t parent_hash, NamespaceId ns,
                const TokenId* tokens) const;
  bool same_tokens(NodeId n, const TokenId* tokens) const;
  // The node holding the key (parent, parent_hash, ns, tokens) whose chained hash is `hash`, or -1.
  NodeId find_hashed(uint64_t hash, NodeId parent, uint64_t parent_hash, NamespaceId ns,
                     const TokenId* tokens) const;
  Lookup lookup_hashed(NodeId parent, uint64_t parent_hash, NamespaceId ns,
                       const TokenId* tokens) const;

  // One slot of the hash map: the low 32 bits of a chained hash (which also give the home slot)
  // and the first node of that hash's collision chain; node < 0 marks an empty slot.
  struct Slot {
    uint32_t lo = 0;
    NodeId node = -1;
  };
  // The slot holding hash `h`, or the empty slot where it would go.
  size_t probe(uint64_t h) const;
  void erase_slot(size_t pos);

  int32_t block_size_;
  int64_t size_ = 0;
  uint64_t changes_ = 0;  // inserts and removes so far (a Lookup is valid while it is unchanged)
  HugeVector<PrefixNode> nodes_;
  HugeVector<TokenId> tokens_;
  std::vector<NodeId> free_nodes_;
  HugeVector<Slot> slots_;  // chained hash -> first node with it
  size_t mask_ = 0;
};

}  // namespace core
}  // namespace pagedkv
