#include "core/prefix_index.hpp"

#include <cassert>
#include <cstring>

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
  nodes_.resize(static_cast<size_t>(max_nodes));
  tokens_.resize(static_cast<size_t>(max_nodes) * static_cast<size_t>(block_size));
  free_nodes_.reserve(static_cast<size_t>(max_nodes));
  for (int64_t i = max_nodes - 1; i >= 0; --i) free_nodes_.push_back(static_cast<NodeId>(i));
  heads_.reserve(static_cast<size_t>(max_nodes));
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

bool PrefixIndex::same_key(NodeId n, NodeId parent, NamespaceId ns, const TokenId* tokens) const {
  const PrefixNode& x = nodes_[static_cast<size_t>(n)];
  return x.parent == parent && x.ns == ns &&
         std::memcmp(this->tokens(n), tokens, sizeof(TokenId) * static_cast<size_t>(block_size_)) ==
             0;
}

NodeId PrefixIndex::find(NodeId parent, NamespaceId ns, const TokenId* tokens) const {
  const uint64_t h = chain_hash(prefix_hash(parent, ns), tokens);
  auto it = heads_.find(h);
  if (it == heads_.end()) return -1;
  for (NodeId n = it->second; n >= 0; n = nodes_[static_cast<size_t>(n)].next_same_hash) {
    if (same_key(n, parent, ns, tokens)) return n;
  }
  return -1;
}

NodeId PrefixIndex::insert(NodeId parent, NamespaceId ns, const TokenId* tokens, LogicalId block) {
  assert(!free_nodes_.empty());
  const NodeId n = free_nodes_.back();
  free_nodes_.pop_back();
  PrefixNode& x = nodes_[static_cast<size_t>(n)];
  x = PrefixNode();
  x.parent = parent;
  x.block = block;
  x.ns = ns;
  x.parent_hash = prefix_hash(parent, ns);
  x.hash = chain_hash(x.parent_hash, tokens);
  x.live = true;
  std::memcpy(&tokens_[static_cast<size_t>(n) * static_cast<size_t>(block_size_)], tokens,
              sizeof(TokenId) * static_cast<size_t>(block_size_));
  auto ins = heads_.emplace(x.hash, n);
  if (!ins.second) {
    x.next_same_hash = ins.first->second;
    ins.first->second = n;
  }
  if (parent != kRootNode) ++nodes_[static_cast<size_t>(parent)].children;
  ++size_;
  return n;
}

void PrefixIndex::remove(NodeId n) {
  PrefixNode& x = nodes_[static_cast<size_t>(n)];
  assert(x.live && x.children == 0);
  auto it = heads_.find(x.hash);
  assert(it != heads_.end());
  if (it->second == n) {
    if (x.next_same_hash < 0) {
      heads_.erase(it);
    } else {
      it->second = x.next_same_hash;
    }
  } else {
    NodeId p = it->second;
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
}

bool PrefixIndex::reachable(NodeId n) const {
  auto it = heads_.find(nodes_[static_cast<size_t>(n)].hash);
  if (it == heads_.end()) return false;
  for (NodeId m = it->second; m >= 0; m = nodes_[static_cast<size_t>(m)].next_same_hash) {
    if (m == n) return true;
  }
  return false;
}

}  // namespace core
}  // namespace pagedkv
