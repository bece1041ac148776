// Sizing a config's pools from byte budgets (CacheConfig::with_pools) and the blocks a decoding
// sequence holds (CacheConfig::blocks_per_sequence): without groups the budgets in blocks; with
// groups each budget split so that every group holds the same number of sequences of the given
// context (a Gemma-3-like model's window groups a small share); at least one device block per
// group; bad budgets and contexts refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include "pagedkv/config.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

// The blocks holding the positions a decoding sequence of `context` tokens keeps, from first
// principles: every position from max(0, context - window) (0 without a window) to context (the
// next token's slot), one block per distinct position / block_size.
int64_t blocks_by_positions(int64_t context, int64_t bs, int64_t window) {
  std::set<int64_t> blocks;
  const int64_t first = window == 0 ? 0 : std::max<int64_t>(0, context - window);
  for (int64_t p = first; p <= context; ++p) blocks.insert(p / bs);
  return static_cast<int64_t>(blocks.size());
}

// Gemma-3-like: five window-1024 layers per full one, one page shape.
CacheConfig gemma_like() {
  CacheConfig c;
  c.num_layers = 6;
  c.block_size = 16;
  KvGroup window;
  window.name = "window";
  window.layers = {0, 1, 2, 3, 4};
  window.num_kv_heads = 2;
  window.head_dim = 32;
  window.sliding_window = 1024;
  KvGroup full = window;
  full.name = "full";
  full.layers = {5};
  full.sliding_window = 0;
  c.groups = {window, full};
  return c;
}

TEST(PoolSizing, BlocksPerSequenceAreTheBlocksOfThePositionsKept) {
  for (const int32_t window : {0, 16, 24, 100, 1024}) {
    CacheConfig c;
    c.block_size = 16;
    c.sliding_window = window;
    for (int64_t context : {0, 1, 15, 16, 17, 99, 100, 1023, 1024, 1025, 5000, 32768}) {
      EXPECT_EQ(c.blocks_per_sequence(context), blocks_by_positions(context, 16, window))
          << "window " << window << " context " << context;
    }
  }
}

TEST(PoolSizing, OneGroupTakesTheBudgetsInWholeBlocks) {
  CacheConfig c;  // 4 layers x 4 heads x 64 dims fp16, 16 tokens: 64 KiB a block
  const int64_t bb = c.block_bytes();
  ASSERT_EQ(bb, 4 * 2 * 16 * 4 * 64 * 2);
  auto sized = c.with_pools(10 * bb + bb - 1, 3 * bb, 4096);
  ASSERT_OK(sized);
  EXPECT_EQ(sized->num_device_blocks, 10);
  EXPECT_EQ(sized->num_host_blocks, 3);
  EXPECT_OK(sized->validate());
  EXPECT_EQ(c.num_device_blocks, 256) << "the config itself is unchanged";
}

// A budget of exactly n sequences of the context gives every group n sequences' blocks: at 32K,
// 2,049 blocks a sequence in the full group, 65 in the window group.
TEST(PoolSizing, GroupsFillTogetherAtTheContext) {
  const CacheConfig c = gemma_like();
  const int64_t window_bb = c.group_config(0).block_bytes();
  const int64_t full_bb = c.group_config(1).block_bytes();
  ASSERT_EQ(window_bb, 5 * full_bb);
  const int64_t context = 32768;
  const int64_t full_per_seq = context / 16 + 1;
  const int64_t window_per_seq = blocks_by_positions(context, 16, 1024);
  ASSERT_EQ(full_per_seq, 2049);
  ASSERT_EQ(window_per_seq, 65);
  const int64_t seq_bytes = full_per_seq * full_bb + window_per_seq * window_bb;
  for (const int64_t n : {1, 7, 10, 333}) {
    auto sized = c.with_pools(n * seq_bytes, 2 * n * seq_bytes + seq_bytes / 2, context);
    ASSERT_OK(sized);
    EXPECT_EQ(sized->groups[0].num_device_blocks, n * window_per_seq) << n;
    EXPECT_EQ(sized->groups[1].num_device_blocks, n * full_per_seq) << n;
    EXPECT_EQ(sized->groups[0].num_host_blocks / window_per_seq, 2 * n) << n;
    EXPECT_EQ(sized->groups[1].num_host_blocks / full_per_seq, 2 * n) << n;
    EXPECT_EQ(sized->num_device_blocks, n * (window_per_seq + full_per_seq));
    EXPECT_OK(sized->validate());
  }
  // At a short context the window group holds every block too: shares follow the layer counts.
  auto short_ctx = c.with_pools(100 * 6 * full_bb, 0, 512);
  ASSERT_OK(short_ctx);
  EXPECT_EQ(short_ctx->groups[0].num_device_blocks, 100);
  EXPECT_EQ(short_ctx->groups[1].num_device_blocks, 100);
}

TEST(PoolSizing, EveryGroupGetsAtLeastOneDeviceBlock) {
  auto sized = gemma_like().with_pools(1, 0, 32768);
  ASSERT_OK(sized);
  EXPECT_EQ(sized->groups[0].num_device_blocks, 1);
  EXPECT_EQ(sized->groups[1].num_device_blocks, 1);
  EXPECT_EQ(sized->groups[0].num_host_blocks, 0);
}

TEST(PoolSizing, BadBudgetsAndContextsAreRefusedByName) {
  const CacheConfig c = gemma_like();
  const struct {
    int64_t device, host, context;
    const char* text;
  } cases[] = {{-1, 0, 100, "budgets must be >= 0"},
               {0, -5, 100, "budgets must be >= 0"},
               {1 << 20, 0, 0, "context must be >= 1"}};
  for (const auto& k : cases) {
    auto r = c.with_pools(k.device, k.host, k.context);
    ASSERT_FALSE(r.ok()) << k.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(k.text), std::string::npos) << r.status().message();
  }
  CacheConfig negative = c;
  negative.groups[0].sliding_window = -16;  // would make a sequence hold no block
  auto w = negative.with_pools(1 << 20, 0, 16);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("groups[0]: sliding_window"), std::string::npos)
      << w.status().message();
  CacheConfig overflow = c;
  overflow.groups[1].head_dim = 1 << 30;
  overflow.groups[1].num_kv_heads = 1 << 30;
  auto r = overflow.with_pools(1 << 20, 0, 100);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("groups[1]"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace pagedkv
