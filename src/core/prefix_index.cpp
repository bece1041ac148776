#include "core/prefix_index.hpp"

#include <algorithm>
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

// Weyl increment of the word keys (splitmix64's) and the multiplier of fold() (wyhash's wyp0).
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kFoldMul = 0xa0761d6478bd642full;

// Multiply-fold: the two halves of the 128-bit product xored (wyhash's mum with a constant).
__extension__ using Uint128 = unsigned __int128;  // GCC and Clang; pedantic mode asks for this
inline uint64_t fold(uint64_t x) {
  const Uint128 p = static_cast<Uint128>(x) * kFoldMul;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

// Two tokens loaded as one 64-bit word are little-endian by definition (the first in the low half).
inline uint64_t le64(uint64_t w) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return (w << 32) | (w >> 32);
#else
  return w;
#endif
}

// The sum over words j < n of fold(word j + (j + 1) * kGolden): the words are independent of
// each other and of the parent, so their multiplies overlap; only chain_hash()'s one mix() is
// serial along a prompt (docs/events.md, "Block hashes").
inline uint64_t digest_words_n(const TokenId* tokens, size_t n) {
  uint64_t sum = 0;
  for (size_t j = 0; j < n; ++j) {
    uint64_t w;
    std::memcpy(&w, tokens + 2 * j, sizeof(w));
    sum += fold(le64(w) + (j + 1) * kGolden);
  }
  return sum;
}

template <size_t kWords>
inline uint64_t digest_words(const TokenId* tokens) {
  return digest_words_n(tokens, kWords);
}

// An xor-or over the block (vectorised) instead of memcmp's call and early exits: a match
// compares every token anyway.
inline bool equal_ids_n(const TokenId* a, const TokenId* b, size_t n) {
  uint32_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<uint32_t>(a[i]) ^ static_cast<uint32_t>(b[i]);
  return diff == 0;
}

template <size_t kIds>
inline bool equal_ids(const TokenId* a, const TokenId* b) {
  return equal_ids_n(a, b, kIds);
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
  return mix(parent_hash ^ (block_digest(tokens) + static_cast<uint64_t>(block_size_)));
}

uint64_t PrefixIndex::block_digest(const TokenId* tokens) const {
  // Common block sizes get a fully unrolled body (the Weyl keys become constants).
  switch (block_size_) {
    case 16:
      return digest_words<8>(tokens);
    case 32:
      return digest_words<16>(tokens);
    default:
      break;
  }
  const size_t whole = static_cast<size_t>(block_size_) / 2;
  uint64_t sum = digest_words_n(tokens, whole);
  if (block_size_ % 2 != 0) {
    sum += fold(static_cast<uint32_t>(tokens[block_size_ - 1]) + (whole + 1) * kGolden);
  }
  return sum;
}

inline bool PrefixIndex::same_tokens(NodeId n, const TokenId* tokens) const {
  const TokenId* mine = this->tokens(n);
  switch (block_size_) {
    case 16:
      return equal_ids<16>(mine, tokens);
    case 32:
      return equal_ids<32>(mine, tokens);
    default:
      return equal_ids_n(mine, tokens, static_cast<size_t>(block_size_));
  }
}

inline bool PrefixIndex::same_key(NodeId n, NodeId parent, uint64_t parent_hash, NamespaceId ns,
                                  const TokenId* tokens) const {
  const PrefixNode& x = nodes_[static_cast<size_t>(n)];
  return x.parent == parent && x.parent_hash == parent_hash && x.ns == ns && same_tokens(n, tokens);
}

NodeId PrefixIndex::find_hashed(uint64_t hash, NodeId parent, uint64_t parent_hash, NamespaceId ns,
                                const TokenId* tokens) const {
  for (NodeId n = slots_[probe(hash)].node; n >= 0;
       n = nodes_[static_cast<size_t>(n)].next_same_hash) {
    if (same_key(n, parent, parent_hash, ns, tokens)) return n;
  }
  return -1;
}

PrefixIndex::Lookup PrefixIndex::lookup_hashed(NodeId parent, uint64_t parent_hash, NamespaceId ns,
                                               const TokenId* tokens) const {
  return lookup_known(parent, parent_hash, chain_hash(parent_hash, tokens), ns, tokens);
}

PrefixIndex::Lookup PrefixIndex::lookup_known(NodeId parent, uint64_t parent_hash, uint64_t hash,
                                              NamespaceId ns, const TokenId* tokens) const {
  assert(hash == chain_hash(parent_hash, tokens));
  Lookup at;
  at.parent = parent;
  at.parent_hash = parent_hash;
  at.ns = ns;
  at.tokens = tokens;
  at.hash = hash;
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

void PrefixIndex::match(NamespaceId ns, const TokenId* tokens, int64_t n,
                        std::vector<LogicalId>* blocks) const {
  // A cached prompt is mostly a chain that was inserted in order, so the parent's newest child is
  // tried first: comparing its key needs no hash and no probe. Only the first block and a branch
  // point (a parent whose newest child is another) hash and probe.
  const size_t bs = static_cast<size_t>(block_size_);
  NodeId parent = kRootNode;
  uint64_t parent_hash = root_hash(ns);
  for (int64_t i = 0; i < n; ++i) {
    const TokenId* t = tokens + static_cast<size_t>(i) * bs;
    NodeId c = parent == kRootNode ? -1 : nodes_[static_cast<size_t>(parent)].newest_child;
    if (c < 0 || !same_key(c, parent, parent_hash, ns, t)) {
      c = find_hashed(chain_hash(parent_hash, t), parent, parent_hash, ns, t);
      if (c < 0) return;
    }
    const PrefixNode& x = nodes_[static_cast<size_t>(c)];
    blocks->push_back(x.block);
    parent = c;
    parent_hash = x.hash;
  }
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
  if (missing.parent != kRootNode) {
    PrefixNode& p = nodes_[static_cast<size_t>(missing.parent)];
    ++p.children;
    p.newest_child = n;
  }
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
  if (x.parent != kRootNode) {
    PrefixNode& p = nodes_[static_cast<size_t>(x.parent)];
    --p.children;
    if (p.newest_child == n) p.newest_child = -1;  // a reused id must not pose as the child
  }
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
