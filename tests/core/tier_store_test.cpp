// TierStore and the tier table: the specs a configuration gives, the per-tier counts, and the
// store's own invariant check naming what disagrees.
#include "core/tier_store.hpp"

#include <gtest/gtest.h>

#include "core/block_allocator.hpp"
#include "core/core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using testing_util::tiny_config;

TEST(TierSpecsTest, DeviceDemotesToTheHostOnlyWhenTheHostTierCachesPrefixes) {
  CacheConfig c = tiny_config(4, 8, 8);
  c.cache_prefixes_on_host = true;
  std::vector<TierSpec> specs = tier_specs(c);
  ASSERT_EQ(specs.size(), static_cast<size_t>(kNumTiers));
  EXPECT_EQ(specs[0].tier, Tier::kDevice);
  EXPECT_EQ(specs[1].tier, Tier::kHost);
  EXPECT_TRUE(specs[0].demotes);
  EXPECT_EQ(specs[0].demote_to, Tier::kHost);
  EXPECT_FALSE(specs[0].last);
  EXPECT_TRUE(specs[1].last);
  EXPECT_FALSE(specs[1].demotes);

  c.cache_prefixes_on_host = false;
  EXPECT_FALSE(tier_specs(c)[0].demotes);
  c = tiny_config(4, 8, 0);
  c.cache_prefixes_on_host = true;
  EXPECT_FALSE(tier_specs(c)[0].demotes) << "no host blocks: nothing to demote to";
}

TEST(TierStoreTest, CountsRoomAndStatsFromItsTierOnly) {
  BlockAllocator blocks(6, 4);
  const std::vector<TierSpec> specs = tier_specs(tiny_config(4, 6, 4));
  TierStore device(&blocks, specs[0]);
  TierStore host(&blocks, specs[1]);
  const LogicalId a = blocks.allocate(Tier::kDevice);
  blocks.allocate(Tier::kDevice);
  blocks.allocate(Tier::kHost);
  device.add_cached();  // say `a` became cached
  EXPECT_EQ(device.free_blocks(), 4);
  EXPECT_EQ(device.room(), 5);
  EXPECT_EQ(host.room(), 3);
  EXPECT_TRUE(device.slot_at_hand());
  const TierStats s = device.stats(100);
  EXPECT_EQ(s.total_blocks, 6);
  EXPECT_EQ(s.free_blocks, 4);
  EXPECT_EQ(s.cached_blocks, 1);
  EXPECT_EQ(s.used_blocks, 1);
  EXPECT_EQ(s.total_bytes, 600);
  EXPECT_EQ(s.used_bytes, 200);
  EXPECT_OK(device.check(/*cached=*/1, /*listed=*/0, /*used=*/1));
  // Each disagreement is named.
  const Status cached = device.check(0, 0, 2);
  EXPECT_EQ(cached.code(), StatusCode::kInternal);
  EXPECT_NE(cached.message().find("device tier: cached count 1 but 0"), std::string::npos)
      << cached.message();
  const Status listed = device.check(1, 1, 1);
  EXPECT_NE(listed.message().find("eviction queue holds 0 blocks but 1"), std::string::npos)
      << listed.message();
  const Status total = device.check(1, 0, 2);
  EXPECT_NE(total.message().find("free 4 + cached 1 + used 2 != total 6"), std::string::npos)
      << total.message();
  device.remove_cached();
  blocks[a].ref = 0;  // allocate() handed it out referenced
  blocks.release(a);
  EXPECT_EQ(device.room(), 5);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
