// copy_blocks and scatter_head_range against naive references.
#include <gtest/gtest.h>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

template <typename Tag>
class CopyScatterTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(CopyScatterTest, AllBackends, BackendName);

TYPED_TEST(CopyScatterTest, CopyBlocksCopiesWholeBlocksForInt32AndInt64Pairs) {
  Backend& be = this->backend();
  const Shape shapes[] = {
      {2, 8, 128, 16, PageLayout::kNHD, 12, DType::kFloat16},
      {3, 3, 80, 1, PageLayout::kHND, 12, DType::kBFloat16},
      {1, 1, 96, 8, PageLayout::kNHD, 12, DType::kFloat32},
      {2, 32, 64, 32, PageLayout::kHND, 12, DType::kFloat8E4M3},
      {1, 3, 256, 128, PageLayout::kNHD, 12, DType::kFloat8E4M3},
  };
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.describe());
    const int64_t block_bytes = s.pool_elems() / s.num_blocks * int64_t(s.esize());
    // Sources and destinations disjoint; one pair out of range (skipped), one src == dst.
    const std::vector<int64_t> pairs = {0, 5, 3, 7, 9, 2, 1, 11, 4, 400, 6, 6};
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed++);
    std::vector<uint8_t> want = pool0;
    for (size_t p = 0; p + 1 < pairs.size(); p += 2) {
      const int64_t src = pairs[p], dst = pairs[p + 1];
      if (dst >= s.num_blocks || src == dst) continue;
      std::memcpy(&want[size_t(dst * block_bytes)], &pool0[size_t(src * block_bytes)],
                  size_t(block_bytes));
    }
    std::vector<int32_t> pairs32(pairs.begin(), pairs.end());
    DeviceBuffer dpool(be, pool0.size()), d64(be, pairs.size() * 8), d32(be, pairs32.size() * 4);
    d64.upload(pairs);
    d32.upload(pairs32);
    PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    for (auto shape : all_launch_shapes()) {
      for (IndexType it : {IndexType::kInt32, IndexType::kInt64}) {
        SCOPED_TRACE(std::string(shape_name(shape)) +
                     (it == IndexType::kInt64 ? " int64" : " int32"));
        LaunchShapeGuard guard(shape);
        dpool.upload(pool0);
        CopyBlocksArgs a;
        a.pairs = it == IndexType::kInt64 ? d64.data() : d32.data();
        a.index_type = it;
        a.num_pairs = int64_t(pairs.size() / 2);
        ASSERT_OK(copy_blocks(be, pool, a));
        EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
      }
    }
  }
}

struct ScatterCase {
  DType pool;
  DType input;
  PageLayout page_layout;
  int heads;
  int head_dim;
  int block_size;
  int head_begin;
  int num_heads;
  ScaleGranularity scales;
};

TYPED_TEST(CopyScatterTest, ScatterHeadRangeMatchesReference) {
  Backend& be = this->backend();
  const ScatterCase cases[] = {
      {DType::kFloat16, DType::kFloat16, PageLayout::kNHD, 8, 128, 16, 2, 4,
       ScaleGranularity::kNone},
      {DType::kFloat16, DType::kFloat32, PageLayout::kHND, 3, 80, 8, 1, 2, ScaleGranularity::kNone},
      {DType::kBFloat16, DType::kBFloat16, PageLayout::kHND, 1, 64, 1, 0, 1,
       ScaleGranularity::kNone},
      {DType::kFloat32, DType::kFloat32, PageLayout::kNHD, 32, 64, 32, 31, 1,
       ScaleGranularity::kNone},
      {DType::kFloat8E4M3, DType::kBFloat16, PageLayout::kNHD, 8, 256, 128, 0, 8,
       ScaleGranularity::kPerHead},
      {DType::kFloat8E4M3, DType::kFloat16, PageLayout::kHND, 3, 96, 16, 1, 2,
       ScaleGranularity::kPerLayer},
  };
  uint32_t seed = 50;
  for (const auto& c : cases) {
    Shape s;
    s.layers = 2;
    s.heads = c.heads;
    s.head_dim = c.head_dim;
    s.block_size = c.block_size;
    s.page_layout = c.page_layout;
    s.dtype = c.pool;
    const int64_t nb = 4, p0 = c.block_size / 2 + 1, n = 3 * c.block_size - 1;
    s.num_blocks = nb + 3;
    SCOPED_TRACE(s.describe() + " input " + dtype_name(c.input));
    seed += 10;
    auto table = shuffled_blocks(s.num_blocks, nb, seed);
    auto ks = random_scales(s, c.scales, seed + 1), vs = random_scales(s, c.scales, seed + 2);
    const int64_t in_elems = int64_t{c.num_heads} * n * c.head_dim;
    auto key = random_values(in_elems, c.input, seed + 3),
         value = random_values(in_elems, c.input, seed + 4);
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed + 5);
    std::vector<uint8_t> want = pool0;
    const int layer = 1;
    for (int part = 0; part < 2; ++part)
      for (int hh = 0; hh < c.num_heads; ++hh) {
        const int h = c.head_begin + hh;
        const float sc = scale_of(part == 0 ? ks : vs, c.scales, s, layer, h);
        for (int64_t t = 0; t < n; ++t)
          for (int d = 0; d < c.head_dim; ++d) {
            const int64_t pos = p0 + t;
            ref_move(want.data(), c.pool,
                     ref_index(s, table[size_t(pos / c.block_size)], layer, part,
                               pos % c.block_size, h, d),
                     (part == 0 ? key : value).data(), c.input, (hh * n + t) * c.head_dim + d, sc,
                     true, c.scales != ScaleGranularity::kNone);
          }
      }
    DeviceBuffer dpool(be, pool0.size()), dk(be, key.size()), dv(be, value.size()),
        dtable(be, table.size() * 4), dks(be, ks.size() * 4), dvs(be, vs.size() * 4);
    dk.upload(key);
    dv.upload(value);
    dtable.upload(table);
    dks.upload(ks);
    dvs.upload(vs);
    ScatterHeadRangeArgs a;
    a.key = dk.data();
    a.value = dv.data();
    a.input_dtype = c.input;
    a.block_table = static_cast<const int32_t*>(dtable.data());
    a.block_table_len = int32_t(nb);
    a.layer = layer;
    a.head_begin = c.head_begin;
    a.num_heads = c.num_heads;
    a.position_begin = p0;
    a.num_tokens = n;
    a.scales = {static_cast<const float*>(dks.data()), static_cast<const float*>(dvs.data()),
                c.scales};
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dpool.upload(pool0);
      const Status st =
          scatter_head_range(be, PoolRef{dpool.data(), s.dtype, s.layout(), s.num_blocks}, a);
      ASSERT_OK(st);
      EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
    }
  }
}

}  // namespace
}  // namespace pagedkv::testing
