// The chained block hash that goes on the wire: the documented formula (written again in
// block_hash_reference.hpp) and the test vector of docs/events.md, observed through a real
// KvCache's events. Stable across processes and restarts: nothing in it is seeded per process.
#include <gtest/gtest.h>

#include <vector>

#include "block_hash_reference.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/events/wire.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

CacheConfig small_config() {
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = 4;
  c.num_device_blocks = 16;
  c.backend = BackendKind::kCpu;
  return c;
}

// Stored events of a prompt of 9 tokens (two full blocks) in namespace `ns`.
std::vector<ControlEvent> stored_events(NamespaceId ns) {
  auto cache = KvCache::create(small_config());
  EXPECT_OK(cache);
  KvCache& kv = **cache;
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  SequenceOptions o;
  o.ns = ns;
  EXPECT_OK(kv.add_sequence(1, prompt, o));
  EXPECT_OK(kv.reserve(1, 9));
  EXPECT_OK(kv.commit(1, prompt));
  std::vector<ControlEvent> out;
  for (ControlEvent& e : kv.drain_events()) {
    if (e.kind == EventKind::kBlockStored) out.push_back(std::move(e));
  }
  return out;
}

TEST(BlockHash, TestVectorOfTheDocs) {
  // docs/events.md, "Block hashes": block_size 4, tokens 1..8, namespaces 0 and 42.
  EXPECT_EQ(testing::ref_root_hash(0), 0x142f68d4ab3e773eull);
  EXPECT_EQ(testing::ref_block_hash(0x142f68d4ab3e773eull, {1, 2, 3, 4}), 0xfadf8d5f13ff6c55ull);
  EXPECT_EQ(testing::ref_block_hash(0xfadf8d5f13ff6c55ull, {5, 6, 7, 8}), 0xf42bb2b817f5178dull);
  EXPECT_EQ(testing::ref_root_hash(42), 0x1078d5fc0ef1fa02ull);
  EXPECT_EQ(testing::ref_block_hash(0x142f68d4ab3e773eull, {1, 2, 3}), 0x8c8b0947e677e827ull);

  const std::vector<ControlEvent> ev = stored_events(0);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].parent_hash, 0x142f68d4ab3e773eull);
  EXPECT_EQ(ev[0].block_hash, 0xfadf8d5f13ff6c55ull);
  EXPECT_EQ(ev[1].parent_hash, 0xfadf8d5f13ff6c55ull);
  EXPECT_EQ(ev[1].block_hash, 0xf42bb2b817f5178dull);
  EXPECT_EQ(events::root_hash(0), 0x142f68d4ab3e773eull);
}

TEST(BlockHash, NamespaceSeedsTheChain) {
  const std::vector<ControlEvent> ev = stored_events(42);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].parent_hash, 0x1078d5fc0ef1fa02ull);
  EXPECT_EQ(ev[0].block_hash, testing::ref_block_hash(0x1078d5fc0ef1fa02ull, {1, 2, 3, 4}));
  EXPECT_EQ(ev[1].block_hash, testing::ref_block_hash(ev[0].block_hash, {5, 6, 7, 8}));
  EXPECT_EQ(ev[0].ns, 42u);
  EXPECT_EQ(events::root_hash(42), 0x1078d5fc0ef1fa02ull);
}

TEST(BlockHash, SameInTwoCachesOfOneProcess) {
  // Nothing per instance either (a restarted engine is a new instance).
  const std::vector<ControlEvent> a = stored_events(5);
  const std::vector<ControlEvent> b = stored_events(5);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a[1].block_hash, b[1].block_hash);
}

}  // namespace
}  // namespace pagedkv
