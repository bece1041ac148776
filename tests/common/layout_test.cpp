// PoolLayout against a naive nested-index formula, for both page layouts, on random shapes.
#include "pagedkv/layout.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace pagedkv {
namespace {

struct Shape {
  int32_t layers, heads, dim, block_size;
  int64_t blocks;
};

// The layout written the obvious way: the pool as a nested row-major array.
int64_t naive_offset(const Shape& s, PageLayout page, int64_t b, int32_t l, int32_t kv, int32_t p,
                     int32_t h, int32_t d) {
  const int64_t page_index = (b * s.layers + l) * 2 + kv;
  if (page == PageLayout::kNHD) {
    return ((page_index * s.block_size + p) * s.heads + h) * s.dim + d;
  }
  return ((page_index * s.heads + h) * s.block_size + p) * s.dim + d;
}

PoolLayout make_layout(const Shape& s, PageLayout page) {
  CacheConfig c;
  c.num_layers = s.layers;
  c.num_kv_heads = s.heads;
  c.head_dim = s.dim;
  c.block_size = s.block_size;
  c.page_layout = page;
  return PoolLayout::from_config(c);
}

class LayoutTest : public ::testing::TestWithParam<PageLayout> {};

TEST_P(LayoutTest, MatchesNaiveFormulaOnRandomShapes) {
  std::mt19937_64 rng(1234);
  const int dims[] = {64, 80, 96, 128, 256};
  const int heads[] = {1, 3, 5, 7, 8, 12, 32};
  const int block_sizes[] = {1, 8, 16, 32, 128};
  for (int trial = 0; trial < 200; ++trial) {
    Shape s{static_cast<int32_t>(1 + rng() % 80), heads[rng() % 7], dims[rng() % 5],
            block_sizes[rng() % 5], static_cast<int64_t>(1 + rng() % 100000)};
    const PoolLayout layout = make_layout(s, GetParam());
    for (int probe = 0; probe < 200; ++probe) {
      const int64_t b = static_cast<int64_t>(rng() % s.blocks);
      const int32_t l = static_cast<int32_t>(rng() % s.layers);
      const int32_t kv = static_cast<int32_t>(rng() % 2);
      const int32_t p = static_cast<int32_t>(rng() % s.block_size);
      const int32_t h = static_cast<int32_t>(rng() % s.heads);
      const int32_t d = static_cast<int32_t>(rng() % s.dim);
      const int64_t expected = naive_offset(s, GetParam(), b, l, kv, p, h, d);
      ASSERT_EQ(layout.element_offset(b, l, static_cast<KvPart>(kv), p, h, d), expected);
      ASSERT_EQ(layout.slot_offset(b * s.block_size + p, l, static_cast<KvPart>(kv), h) + d,
                expected);
      ASSERT_EQ(layout.page_offset(b, l, static_cast<KvPart>(kv)),
                naive_offset(s, GetParam(), b, l, kv, 0, 0, 0));
    }
    // Strides are the differences of the naive formula.
    EXPECT_EQ(layout.block_elems(), naive_offset(s, GetParam(), 1, 0, 0, 0, 0, 0) -
                                        naive_offset(s, GetParam(), 0, 0, 0, 0, 0, 0));
    EXPECT_EQ(layout.layer_stride(), int64_t{2} * s.block_size * s.heads * s.dim);
    EXPECT_EQ(layout.kv_stride(), int64_t{s.block_size} * s.heads * s.dim);
    if (s.block_size > 1) {
      EXPECT_EQ(layout.token_stride(), naive_offset(s, GetParam(), 0, 0, 0, 1, 0, 0));
    }
    if (s.heads > 1) {
      EXPECT_EQ(layout.head_stride(), naive_offset(s, GetParam(), 0, 0, 0, 0, 1, 0));
    }
  }
}

TEST_P(LayoutTest, EveryElementOfASmallPoolHasItsOwnOffset) {
  const Shape s{3, 3, 80, 5, 4};
  const PoolLayout layout = make_layout(s, GetParam());
  const int64_t total = s.blocks * layout.block_elems();
  std::vector<int> hits(static_cast<size_t>(total), 0);
  for (int64_t b = 0; b < s.blocks; ++b)
    for (int32_t l = 0; l < s.layers; ++l)
      for (int32_t kv = 0; kv < 2; ++kv)
        for (int32_t p = 0; p < s.block_size; ++p)
          for (int32_t h = 0; h < s.heads; ++h)
            for (int32_t d = 0; d < s.dim; ++d) {
              const int64_t off = layout.element_offset(b, l, static_cast<KvPart>(kv), p, h, d);
              ASSERT_GE(off, 0);
              ASSERT_LT(off, total);
              ++hits[static_cast<size_t>(off)];
            }
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << i;
}

TEST_P(LayoutTest, PositionOffsetFollowsTheBlockTable) {
  const Shape s{2, 3, 64, 4, 10};
  const PoolLayout layout = make_layout(s, GetParam());
  const int32_t table[] = {7, 2, 9};  // logical block i lives in physical block table[i]
  for (int64_t pos = 0; pos < 12; ++pos) {
    EXPECT_EQ(
        layout.position_offset(table, pos, 1, KvPart::kValue, 2),
        naive_offset(s, GetParam(), table[pos / 4], 1, 1, static_cast<int32_t>(pos % 4), 2, 0));
  }
}

TEST(Layout, HugePoolOffsetsDoNotOverflow32Bits) {
  const Shape s{80, 8, 128, 16, 200000};
  const PoolLayout layout = make_layout(s, PageLayout::kNHD);
  const int64_t last = layout.element_offset(s.blocks - 1, 79, KvPart::kValue, 15, 7, 127);
  EXPECT_EQ(last, s.blocks * layout.block_elems() - 1);
  EXPECT_GT(last, int64_t{1} << 32);
}

INSTANTIATE_TEST_SUITE_P(PageLayouts, LayoutTest,
                         ::testing::Values(PageLayout::kNHD, PageLayout::kHND),
                         [](const auto& info) {
                           return std::string(page_layout_name(info.param));
                         });

}  // namespace
}  // namespace pagedkv
