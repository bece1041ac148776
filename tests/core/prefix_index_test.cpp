// PrefixIndex's lookup-then-insert: a lookup that misses gives the key's hash and map slot, and
// inserting from it gives the node a plain insert of the key gives (same hash, found by find,
// under the same parent); on random keys with removals in between, an index filled through
// lookups answers every find as one filled through plain inserts, and as a plain map of keys.
#include "core/prefix_index.hpp"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "events/block_hash_reference.hpp"

namespace pagedkv {
namespace core {
namespace {

constexpr int32_t kBlock = 4;

// The documented block hash (docs/events.md), through both digest paths (the unrolled block
// sizes 16 and 32, and the general loop with an odd tail), against values a Python
// implementation of the formula gave and against the test suite's own reference.
TEST(PrefixIndexTest, ChainHashIsTheDocumentedFormula) {
  std::vector<TokenId> b16(16), b32(32);
  std::iota(b16.begin(), b16.end(), 1);
  std::iota(b32.begin(), b32.end(), 100);
  const std::vector<TokenId> b5 = {-1, 7, 2147483647, -2147483647 - 1, 5};
  const uint64_t root0 = PrefixIndex::root_hash(0);
  EXPECT_EQ(PrefixIndex(16, 1).chain_hash(root0, b16.data()), 0x4c0505f43d60d444ull);
  EXPECT_EQ(PrefixIndex(32, 1).chain_hash(root0, b32.data()), 0x4ab72a5600036545ull);
  EXPECT_EQ(PrefixIndex(5, 1).chain_hash(PrefixIndex::root_hash(7), b5.data()),
            0x0d921d2c245d9bbaull);
  EXPECT_EQ(PrefixIndex(2, 1).chain_hash(root0, std::vector<TokenId>{0, 0}.data()),
            0xd30056e39fe3cc97ull);

  std::mt19937 rng(11);
  for (int32_t bs = 1; bs <= 40; ++bs) {
    std::vector<TokenId> t(static_cast<size_t>(bs));
    for (TokenId& x : t) x = static_cast<TokenId>(rng());
    const uint64_t parent = (uint64_t{rng()} << 32) | rng();
    EXPECT_EQ(PrefixIndex(bs, 1).chain_hash(parent, t.data()), testing::ref_block_hash(parent, t))
        << "block size " << bs;
  }
}

TEST(PrefixIndexTest, InsertFromAMissedLookupIsThePlainInsert) {
  PrefixIndex index(kBlock, 16);
  const std::vector<TokenId> a = {1, 2, 3, 4};
  const std::vector<TokenId> b = {5, 6, 7, 8};

  const PrefixIndex::Lookup miss = index.lookup(kRootNode, 0, a.data());
  EXPECT_LT(miss.found, 0);
  EXPECT_EQ(miss.hash, index.chain_hash(PrefixIndex::root_hash(0), a.data()));
  const NodeId first = index.insert(miss, /*block=*/7);
  EXPECT_EQ(index.find(kRootNode, 0, a.data()), first);
  EXPECT_EQ(index.node(first).hash, miss.hash);
  EXPECT_EQ(index.node(first).block, 7);
  EXPECT_EQ(index.node(first).parent, kRootNode);

  // A child through a lookup, and the same key through a plain insert in a second index.
  const PrefixIndex::Lookup child_miss = index.lookup(first, 0, b.data());
  const NodeId child = index.insert(child_miss, 8);
  EXPECT_EQ(index.node(first).children, 1);
  EXPECT_EQ(index.node(child).parent, first);
  EXPECT_EQ(index.node(child).parent_hash, index.node(first).hash);
  PrefixIndex plain(kBlock, 16);
  const NodeId plain_child = plain.insert(plain.insert(kRootNode, 0, a.data(), 7), 0, b.data(), 8);
  EXPECT_EQ(plain.node(plain_child).hash, index.node(child).hash);

  // Found now: the same node, hash and slot as the lookup that missed.
  const PrefixIndex::Lookup hit = index.lookup(first, 0, b.data());
  EXPECT_EQ(hit.found, child);
  EXPECT_EQ(hit.hash, child_miss.hash);
  EXPECT_EQ(hit.slot, child_miss.slot);

  // Flat keys: the prefix's hash instead of a parent node; another namespace is another key.
  const uint64_t prefix = index.node(child).hash;
  const PrefixIndex::Lookup flat_miss = index.lookup_flat(prefix, 0, a.data());
  EXPECT_LT(flat_miss.found, 0);
  const NodeId flat = index.insert(flat_miss, 9);
  EXPECT_EQ(index.find_flat(prefix, 0, a.data()), flat);
  EXPECT_EQ(index.node(flat).parent, kRootNode);
  EXPECT_LT(index.find_flat(prefix, 1, a.data()), 0);
  EXPECT_EQ(index.size(), 3);
}

TEST(PrefixIndexTest, IndexFilledThroughLookupsAnswersAsOneFilledByPlainInserts) {
  // Few distinct tokens, so keys repeat (lookups that hit) and many share a home slot.
  std::mt19937 rng(17);
  std::uniform_int_distribution<TokenId> token(0, 3);
  constexpr int64_t kMax = 256;
  PrefixIndex looked(kBlock, kMax);
  PrefixIndex plain(kBlock, kMax);
  std::vector<NodeId> looked_nodes, plain_nodes;  // live first blocks, in the same order
  for (int step = 0; step < 4000; ++step) {
    std::vector<TokenId> t(kBlock);
    for (TokenId& x : t) x = token(rng);
    const bool remove = !looked_nodes.empty() && (rng() % 3 == 0 || looked.size() == kMax);
    if (remove) {
      const size_t i = rng() % looked_nodes.size();
      looked.remove(looked_nodes[i]);
      plain.remove(plain_nodes[i]);
      looked_nodes.erase(looked_nodes.begin() + static_cast<std::ptrdiff_t>(i));
      plain_nodes.erase(plain_nodes.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const PrefixIndex::Lookup at = looked.lookup(kRootNode, 0, t.data());
    const NodeId plain_found = plain.find(kRootNode, 0, t.data());
    ASSERT_EQ(at.found >= 0, plain_found >= 0) << "step " << step;
    if (at.found >= 0) {
      EXPECT_EQ(looked.node(at.found).hash, plain.node(plain_found).hash);
      continue;
    }
    looked_nodes.push_back(looked.insert(at, static_cast<LogicalId>(step)));
    plain_nodes.push_back(plain.insert(kRootNode, 0, t.data(), static_cast<LogicalId>(step)));
  }
  // Every live key is found in both, at the block it was inserted with.
  ASSERT_EQ(looked.size(), plain.size());
  for (size_t i = 0; i < looked_nodes.size(); ++i) {
    const NodeId n = looked.find(kRootNode, 0, looked.tokens(looked_nodes[i]));
    ASSERT_EQ(n, looked_nodes[i]);
    EXPECT_TRUE(looked.reachable(n));
    EXPECT_EQ(looked.node(n).block, plain.node(plain_nodes[i]).block);
  }
}

// The hash map against a plain map of keys: root and flat keys over few distinct tokens and
// prefixes in a small index (every slot run shared, the backward shift moving entries across
// the one insert() holds back), with finds of present and absent keys, inserts and removes
// interleaved in every order; after each step every live key is found at its node and reachable.
TEST(PrefixIndexTest, AnswersAsAMapOfItsKeys) {
  constexpr int64_t kMax = 48;
  std::mt19937 rng(29);
  PrefixIndex index(kBlock, kMax);
  using Key = std::pair<int, std::vector<TokenId>>;  // prefix (-1: a root key), tokens
  std::map<Key, NodeId> model;
  const std::vector<uint64_t> prefixes = {11, 12, 13};
  const auto random_key = [&] {
    Key k{static_cast<int>(rng() % 4) - 1, std::vector<TokenId>(kBlock)};
    for (TokenId& x : k.second) x = static_cast<TokenId>(rng() % 3);
    return k;
  };
  const auto find = [&](const Key& k) {
    return k.first < 0
               ? index.find(kRootNode, 0, k.second.data())
               : index.find_flat(prefixes[static_cast<size_t>(k.first)], 0, k.second.data());
  };
  for (int step = 0; step < 20000; ++step) {
    const Key k = random_key();
    const auto it = model.find(k);
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {  // find
      ASSERT_EQ(find(k), it == model.end() ? NodeId{-1} : it->second) << "step " << step;
    } else if (op == 1 && it == model.end() && index.size() < kMax) {  // insert
      const LogicalId block = step;
      const NodeId n = k.first < 0 ? index.insert(kRootNode, 0, k.second.data(), block)
                                   : index.insert_flat(prefixes[static_cast<size_t>(k.first)], 0,
                                                       k.second.data(), block);
      model.emplace(k, n);
    } else if (op == 2 && !model.empty()) {  // remove a random live key
      auto victim = model.begin();
      std::advance(victim, static_cast<std::ptrdiff_t>(rng() % model.size()));
      index.remove(victim->second);
      model.erase(victim);
    }
    ASSERT_EQ(index.size(), static_cast<int64_t>(model.size()));
    for (const auto& [key, node] : model) {
      ASSERT_EQ(find(key), node) << "step " << step;
      ASSERT_TRUE(index.reachable(node)) << "step " << step;
      ASSERT_TRUE(index.contains_hash(index.node(node).hash)) << "step " << step;
    }
  }
}

// match() tries each parent's newest child before hashing: on a bushy tree (2-token blocks over
// two ids, so four children at most) with leaves removed and node ids reused throughout, it
// answers as a walk of find() block by block.
TEST(PrefixIndexTest, MatchAnswersAsAWalkOfFinds) {
  constexpr int32_t kBs = 2;
  constexpr int64_t kDepth = 6;
  std::mt19937 rng(23);
  PrefixIndex index(kBs, 64);
  const auto random_prompt = [&rng] {
    std::vector<TokenId> p(static_cast<size_t>(kBs * (1 + rng() % kDepth)));
    for (TokenId& x : p) x = static_cast<TokenId>(rng() % 2);
    return p;
  };
  for (int step = 0; step < 5000; ++step) {
    const std::vector<TokenId> p = random_prompt();
    const int64_t n = static_cast<int64_t>(p.size()) / kBs;
    std::vector<LogicalId> want;
    NodeId parent = kRootNode;
    for (int64_t i = 0; i < n; ++i) {
      const NodeId c = index.find(parent, 0, &p[static_cast<size_t>(i * kBs)]);
      if (c < 0) break;
      want.push_back(index.node(c).block);
      parent = c;
    }
    std::vector<LogicalId> got;
    index.match(0, p.data(), n, &got);
    ASSERT_EQ(got, want) << "step " << step;

    if (rng() % 2 == 0) {  // register the rest of the prompt, room permitting
      for (int64_t i = static_cast<int64_t>(want.size()); i < n && index.size() < 64; ++i) {
        parent = index.insert(parent, 0, &p[static_cast<size_t>(i * kBs)], step);
      }
    } else {  // remove a few leaves
      for (NodeId m = 0; m < index.capacity(); ++m) {
        if (index.node(m).live && index.node(m).children == 0 && rng() % 4 == 0) index.remove(m);
      }
    }
  }
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
