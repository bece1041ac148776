#include "core/prefix_index.hpp"

#include <cassert>
#include <cstring>

#include "core/huge_pages.hpp"

namespace pagedkv {
namespace core {

namespace {

// splitmix64 finalizer: cheap and well mixed, good enough for routing hashes; equality is
// always confirmed on the full key.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PrefixIndex::PrefixIndex(int32_t block_size, int64_t max_nodes) : block_size_(block_size) {
  resize_huge(&nodes_, static_cast<size_t>(max_nodes));
  resize_huge(&tokens_, static_cast<size_t>(max_nodes) * static_cast<size_t>(block_size));
  free_nodes_.reserve(static_cast<size_t>(max_nodes));
  for (int64_t i = max_nodes - 1; i >= 0; --i) free_nodes_.push_back(static_cast<NodeId>(i));
  size_t cap = 16;
  while (cap < 2 * static_cast<size_t>(max_nodes)) cap *= 2;
  resize_huge(&slots_, cap);
  mask_ = cap - 1;
}

size_t PrefixIndex::probe(uint64_t h) const {
  const uint32_t lo = static_cast<uint32_t>(h);
  for (size_t i = lo & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.node < 0) return i;
    if (s.lo == lo && nodes_[static_cast<size_t>(s.node)].hash == h) return i;
  }
}

void PrefixIndex::erase_slot(size_t pos) {
  // Backward shift: pull later entries of the probe run into the hole unless that would move
  // one before its home slot, so lookups never need tombstones.
  size_t hole = pos;
  for (size_t i = (pos + 1) & mask_; slots_[i].node >= 0; i = (i + 1) & mask_) {
    const size_t home = slots_[i].lo & mask_;
    if (((i - home) & mask_) >= ((i - hole) & mask_)) {
      slots_[hole] = slots_[i];
      hole = i;
    }
  }
  slots_[hole] = Slot();
}

uint64_t PrefixIndex::root_hash(NamespaceId ns) { return mix(ns ^ 0x70616765646b7630ull); }

uint64_t PrefixIndex::chain_hash(uint64_t parent_hash, const TokenId* tokens) const {
  uint64_t h = parent_hash;
  // Two tokens per mix round halves the cost; the final mix spreads the last round.
  int32_t i = 0;
  for (; i + 1 < block_size_; i += 2) {
    const uint64_t pair = (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) << 32) |
                          static_cast<uint32_t>(tokens[i + 1]);
    h = mix(h ^ pair);
  }
  if (i < block_size_) h = mix(h ^ static_cast<uint32_t>(tokens[i]) ^ 0xa5a5000000000000ull);
  return mix(h + static_cast<uint64_t>(block_size_));
}

bool PrefixIndex::same_key(NodeId n, NodeId parent, uint64_t parent_hash, NamespaceId ns,
                           const TokenId* tokens) const {
  const PrefixNode& x = nodes_[static_cast<size_t>(n)];
  return x.parent == parent && x.parent_hash == parent_hash && x.ns == ns &&
         std::memcmp(this->tokens(n), tokens, sizeof(TokenId) * static_cast<size_t>(block_size_)) ==
             0;
}

PrefixIndex::Lookup PrefixIndex::lookup_hashed(NodeId parent, uint64_t parent_hash, NamespaceId ns,
                                               const TokenId* tokens) const {
  Lookup at;
  at.parent = parent;
  at.parent_hash = parent_hash;
  at.ns = ns;
  at.tokens = tokens;
  at.hash = chain_hash(parent_hash, tokens);
  at.slot = probe(at.hash);
  at.changes = changes_;
  for (NodeId n = slots_[at.slot].node; n >= 0; n = nodes_[static_cast<size_t>(n)].next_same_hash) {
    if (same_key(n, parent, parent_hash, ns, tokens)) {
      at.found = n;
      break;
    }
  }
  return at;
}

NodeId PrefixIndex::find(NodeId parent, NamespaceId ns, const TokenId* tokens) const {
  return lookup(parent, ns, tokens).found;
}

NodeId PrefixIndex::find_flat(uint64_t parent_hash, NamespaceId ns, const TokenId* tokens) const {
  return lookup_flat(parent_hash, ns, tokens).found;
}

NodeId PrefixIndex::insert(NodeId parent, NamespaceId ns, const TokenId* tokens, LogicalId block) {
  return insert(lookup(parent, ns, tokens), block);
}

NodeId PrefixIndex::insert_flat(uint64_t parent_hash, NamespaceId ns, const TokenId* tokens,
                                LogicalId block) {
  return insert(lookup_flat(parent_hash, ns, tokens), block);
}

NodeId PrefixIndex::insert(const Lookup& missing, LogicalId block) {
  assert(missing.found < 0 && missing.changes == changes_ && !free_nodes_.empty());
  const NodeId n = free_nodes_.back();
  free_nodes_.pop_back();
  PrefixNode& x = nodes_[static_cast<size_t>(n)];
  x = PrefixNode();
  x.parent = missing.parent;
  x.block = block;
  x.ns = missing.ns;
  x.parent_hash = missing.parent_hash;
  x.hash = missing.hash;
  x.live = true;
  std::memcpy(&tokens_[static_cast<size_t>(n) * static_cast<size_t>(block_size_)], missing.tokens,
              sizeof(TokenId) * static_cast<size_t>(block_size_));
  Slot& slot = slots_[missing.slot];
  x.next_same_hash = slot.node;  // -1 for a new hash; else n heads the collision chain
  slot.lo = static_cast<uint32_t>(x.hash);
  slot.node = n;
  if (missing.parent != kRootNode) ++nodes_[static_cast<size_t>(missing.parent)].children;
  ++size_;
  ++changes_;
  return n;
}

void PrefixIndex::remove(NodeId n) {
  PrefixNode& x = nodes_[static_cast<size_t>(n)];
  assert(x.live && x.children == 0);
  const size_t pos = probe(x.hash);
  Slot& slot = slots_[pos];
  assert(slot.node >= 0);
  if (slot.node == n) {
    if (x.next_same_hash < 0) {
      erase_slot(pos);
    } else {
      slot.node = x.next_same_hash;
    }
  } else {
    NodeId p = slot.node;
    while (nodes_[static_cast<size_t>(p)].next_same_hash != n) {
      p = nodes_[static_cast<size_t>(p)].next_same_hash;
    }
    nodes_[static_cast<size_t>(p)].next_same_hash = x.next_same_hash;
  }
  if (x.parent != kRootNode) --nodes_[static_cast<size_t>(x.parent)].children;
  x.live = false;
  x.block = kNoBlock;
  free_nodes_.push_back(n);
  --size_;
  ++changes_;
}

bool PrefixIndex::reachable(NodeId n) const {
  const NodeId head = slots_[probe(nodes_[static_cast<size_t>(n)].hash)].node;
  for (NodeId m = head; m >= 0; m = nodes_[static_cast<size_t>(m)].next_same_hash) {
    if (m == n) return true;
  }
  return false;
}

}  // namespace core
}  // namespace pagedkv
