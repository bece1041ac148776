// gather_layer / import_layer and their batch forms against a naive reference: every dtype,
// both page layouts, both packed layouts, fp8 dequantisation, other layers untouched on import.
#include <gtest/gtest.h>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

struct PackCase {
  DType pool;
  DType packed;
  PageLayout page_layout;
  PackedLayout packed_layout;
  int heads;
  int head_dim;
  int block_size;
  ScaleGranularity scales;
};

const PackCase kCases[] = {
    {DType::kFloat16, DType::kFloat16, PageLayout::kNHD, PackedLayout::kHeadMajor, 8, 128, 16,
     ScaleGranularity::kNone},
    {DType::kFloat16, DType::kFloat32, PageLayout::kHND, PackedLayout::kTokenMajor, 3, 80, 8,
     ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kBFloat16, PageLayout::kHND, PackedLayout::kHeadMajor, 1, 64, 1,
     ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kFloat16, PageLayout::kNHD, PackedLayout::kTokenMajor, 32, 64, 32,
     ScaleGranularity::kNone},
    {DType::kFloat32, DType::kFloat32, PageLayout::kNHD, PackedLayout::kTokenMajor, 3, 96, 16,
     ScaleGranularity::kNone},
    {DType::kFloat32, DType::kBFloat16, PageLayout::kHND, PackedLayout::kHeadMajor, 8, 256, 8,
     ScaleGranularity::kNone},
    {DType::kFloat8E4M3, DType::kFloat16, PageLayout::kHND, PackedLayout::kHeadMajor, 8, 128, 128,
     ScaleGranularity::kPerLayer},
    {DType::kFloat8E4M3, DType::kFloat32, PageLayout::kNHD, PackedLayout::kTokenMajor, 3, 80, 16,
     ScaleGranularity::kPerHead},
    {DType::kFloat8E4M3, DType::kBFloat16, PageLayout::kNHD, PackedLayout::kHeadMajor, 1, 256, 32,
     ScaleGranularity::kPerHead},
    {DType::kFloat8E4M3, DType::kFloat8E4M3, PageLayout::kHND, PackedLayout::kTokenMajor, 8, 96, 8,
     ScaleGranularity::kNone},
    // Odd rows for the narrow shape's lanes (see write_kv_test.cpp): idle lanes, several chunks
    // per lane, heads of 24, 14 and 400 bytes, chunks of 4 converted elements.
    {DType::kFloat16, DType::kFloat16, PageLayout::kNHD, PackedLayout::kTokenMajor, 5, 12, 8,
     ScaleGranularity::kNone},
    {DType::kFloat16, DType::kFloat16, PageLayout::kHND, PackedLayout::kHeadMajor, 3, 7, 4,
     ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kBFloat16, PageLayout::kHND, PackedLayout::kTokenMajor, 6, 200, 8,
     ScaleGranularity::kNone},
    {DType::kFloat32, DType::kFloat16, PageLayout::kNHD, PackedLayout::kHeadMajor, 7, 40, 16,
     ScaleGranularity::kNone},
    {DType::kFloat8E4M3, DType::kBFloat16, PageLayout::kHND, PackedLayout::kTokenMajor, 5, 36, 8,
     ScaleGranularity::kPerHead},
};

Shape shape_of(const PackCase& c) {
  Shape s;
  s.layers = 3;
  s.heads = c.heads;
  s.head_dim = c.head_dim;
  s.block_size = c.block_size;
  s.page_layout = c.page_layout;
  s.dtype = c.pool;
  return s;
}

/// Element index inside a packed [heads, len, dim] or [len, heads, dim] sequence block.
int64_t packed_index(const PackCase& c, int64_t len, int64_t t, int h, int d) {
  if (c.packed_layout == PackedLayout::kHeadMajor) return (h * len + t) * c.head_dim + d;
  return (t * c.heads + h) * int64_t{c.head_dim} + d;
}

/// One batch: sequences of given lengths over disjoint shuffled blocks.
struct Batch {
  std::vector<int32_t> lens, indptr, tables;
  int32_t max_blocks = 0;
  int64_t total = 0;
};

Batch make_batch(const Shape& s, const std::vector<int32_t>& lens, uint32_t seed) {
  Batch b;
  b.lens = lens;
  b.indptr = {0};
  int64_t blocks_needed = 0;
  for (int32_t len : lens) {
    b.indptr.push_back(b.indptr.back() + len);
    const int32_t nb = (len + s.block_size - 1) / s.block_size;
    b.max_blocks = std::max(b.max_blocks, nb + 1);  // a spare entry: tables are padded
    blocks_needed += nb;
  }
  b.total = b.indptr.back();
  auto blocks = shuffled_blocks(s.num_blocks, blocks_needed, seed);
  b.tables.assign(lens.size() * size_t(b.max_blocks), -1);
  size_t next = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    const int32_t nb = (lens[i] + s.block_size - 1) / s.block_size;
    for (int32_t j = 0; j < nb; ++j)
      b.tables[i * size_t(b.max_blocks) + size_t(j)] = blocks[next++];
  }
  return b;
}

template <typename Tag>
class GatherImportTest : public BackendTest<Tag> {
 protected:
  // Single sequence, positions [p0, p0 + n) of a table of `nb` shuffled blocks.
  void run_single(const PackCase& c, bool import, uint32_t seed) {
    Backend& be = this->backend();
    Shape s = shape_of(c);
    const int64_t nb = 5, p0 = c.block_size > 1 ? 3 : 1;
    const int64_t n = nb * c.block_size - p0 - 1;
    s.num_blocks = nb + 4;
    SCOPED_TRACE(s.describe() + " packed " + dtype_name(c.packed) +
                 (import ? " import" : " gather"));
    auto table = shuffled_blocks(s.num_blocks, nb, seed);
    auto ks = random_scales(s, c.scales, seed + 1), vs = random_scales(s, c.scales, seed + 2);
    const bool scaled = c.scales != ScaleGranularity::kNone;
    const int layer = 2;
    const size_t pes = dtype_size(c.packed);
    const int64_t packed_elems = n * c.heads * c.head_dim;
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed + 3);
    std::vector<uint8_t> pk = import ? random_values(packed_elems, c.packed, seed + 4)
                                     : std::vector<uint8_t>(size_t(packed_elems) * pes, 0xAB);
    std::vector<uint8_t> pv = import ? random_values(packed_elems, c.packed, seed + 5)
                                     : std::vector<uint8_t>(size_t(packed_elems) * pes, 0xAB);
    std::vector<uint8_t> want_pool = pool0, want_k = pk, want_v = pv;
    for (int part = 0; part < 2; ++part) {
      auto& packed = part == 0 ? (import ? pk : want_k) : (import ? pv : want_v);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = p0 + t;
        for (int h = 0; h < c.heads; ++h) {
          const float sc = scale_of(part == 0 ? ks : vs, c.scales, s, layer, h);
          for (int d = 0; d < c.head_dim; ++d) {
            const int64_t pi = ref_index(s, table[size_t(pos / c.block_size)], layer, part,
                                         pos % c.block_size, h, d);
            const int64_t li = packed_index(c, n, t, h, d);
            if (import) {
              ref_move(want_pool.data(), c.pool, pi, packed.data(), c.packed, li, sc, true, scaled);
            } else {
              ref_move(packed.data(), c.packed, li, pool0.data(), c.pool, pi, sc, false, scaled);
            }
          }
        }
      }
    }
    DeviceBuffer dpool(be, pool0.size()), dk(be, pk.size()), dv(be, pv.size()),
        dtable(be, table.size() * 4), dks(be, ks.size() * 4), dvs(be, vs.size() * 4);
    dtable.upload(table);
    dks.upload(ks);
    dvs.upload(vs);
    PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    PackedLayerArgs a;
    a.key = dk.data();
    a.value = dv.data();
    a.packed_dtype = c.packed;
    a.packed_layout = c.packed_layout;
    a.block_table = static_cast<const int32_t*>(dtable.data());
    a.block_table_len = int32_t(nb);
    a.layer = layer;
    a.position_begin = p0;
    a.num_tokens = n;
    a.scales = {static_cast<const float*>(dks.data()), static_cast<const float*>(dvs.data()),
                c.scales};
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dpool.upload(pool0);
      dk.upload(pk);
      dv.upload(pv);
      const Status st = import ? import_layer(be, pool, a) : gather_layer(be, pool, a);
      ASSERT_OK(st);
      if (import) {
        EXPECT_TRUE(bytes_equal(want_pool, dpool.download<uint8_t>()));
      } else {
        EXPECT_TRUE(bytes_equal(want_k, dk.download<uint8_t>()));
        EXPECT_TRUE(bytes_equal(want_v, dv.download<uint8_t>()));
        EXPECT_TRUE(bytes_equal(pool0, dpool.download<uint8_t>()));
      }
    }
  }

  void run_batch(const PackCase& c, bool import, uint32_t seed) {
    Backend& be = this->backend();
    Shape s = shape_of(c);
    s.num_blocks = 64 / c.block_size + 16;
    SCOPED_TRACE(s.describe() + " packed " + dtype_name(c.packed) +
                 (import ? " batch import" : " batch gather"));
    const std::vector<int32_t> lens = {5, 0, 1, c.block_size + 2, 17, 2 * c.block_size};
    Batch b = make_batch(s, lens, seed);
    auto ks = random_scales(s, c.scales, seed + 1), vs = random_scales(s, c.scales, seed + 2);
    const bool scaled = c.scales != ScaleGranularity::kNone;
    const int layer = 1;
    const size_t pes = dtype_size(c.packed);
    const int64_t packed_elems = b.total * c.heads * c.head_dim;
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed + 3);
    std::vector<uint8_t> pk = import ? random_values(packed_elems, c.packed, seed + 4)
                                     : std::vector<uint8_t>(size_t(packed_elems) * pes, 0xAB);
    std::vector<uint8_t> pv = import ? random_values(packed_elems, c.packed, seed + 5)
                                     : std::vector<uint8_t>(size_t(packed_elems) * pes, 0xAB);
    std::vector<uint8_t> want_pool = pool0, want_k = pk, want_v = pv;
    for (size_t i = 0; i < lens.size(); ++i) {
      const int64_t len = lens[i];
      const int64_t base = int64_t{b.indptr[i]} * c.heads * c.head_dim;
      for (int part = 0; part < 2; ++part) {
        auto& packed = part == 0 ? (import ? pk : want_k) : (import ? pv : want_v);
        for (int64_t pos = 0; pos < len; ++pos)
          for (int h = 0; h < c.heads; ++h) {
            const float sc = scale_of(part == 0 ? ks : vs, c.scales, s, layer, h);
            for (int d = 0; d < c.head_dim; ++d) {
              const int64_t block = b.tables[i * size_t(b.max_blocks) + size_t(pos / c.block_size)];
              const int64_t pi = ref_index(s, block, layer, part, pos % c.block_size, h, d);
              const int64_t li = base + packed_index(c, len, pos, h, d);
              if (import) {
                ref_move(want_pool.data(), c.pool, pi, packed.data(), c.packed, li, sc, true,
                         scaled);
              } else {
                ref_move(packed.data(), c.packed, li, pool0.data(), c.pool, pi, sc, false, scaled);
              }
            }
          }
      }
    }
    DeviceBuffer dpool(be, pool0.size()), dk(be, pk.size()), dv(be, pv.size()),
        dtables(be, b.tables.size() * 4), dindptr(be, b.indptr.size() * 4), dks(be, ks.size() * 4),
        dvs(be, vs.size() * 4);
    dtables.upload(b.tables);
    dindptr.upload(b.indptr);
    dks.upload(ks);
    dvs.upload(vs);
    PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    PackedBatchArgs a;
    a.key = dk.data();
    a.value = dv.data();
    a.packed_dtype = c.packed;
    a.packed_layout = c.packed_layout;
    a.block_tables = static_cast<const int32_t*>(dtables.data());
    a.max_blocks_per_seq = b.max_blocks;
    a.indptr = static_cast<const int32_t*>(dindptr.data());
    a.batch_size = int32_t(lens.size());
    a.total_tokens = b.total;
    a.layer = layer;
    a.scales = {static_cast<const float*>(dks.data()), static_cast<const float*>(dvs.data()),
                c.scales};
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dpool.upload(pool0);
      dk.upload(pk);
      dv.upload(pv);
      const Status st = import ? import_layer_batch(be, pool, a) : gather_layer_batch(be, pool, a);
      ASSERT_OK(st);
      if (import) {
        EXPECT_TRUE(bytes_equal(want_pool, dpool.download<uint8_t>()));
      } else {
        EXPECT_TRUE(bytes_equal(want_k, dk.download<uint8_t>()));
        EXPECT_TRUE(bytes_equal(want_v, dv.download<uint8_t>()));
      }
    }
  }
};

TYPED_TEST_SUITE(GatherImportTest, AllBackends, BackendName);

TYPED_TEST(GatherImportTest, GatherOneSequenceMatchesReference) {
  uint32_t seed = 10;
  for (const auto& c : kCases) this->run_single(c, /*import=*/false, seed += 10);
}

TYPED_TEST(GatherImportTest, ImportOneSequenceWritesOnlyThatLayer) {
  uint32_t seed = 300;
  for (const auto& c : kCases) this->run_single(c, /*import=*/true, seed += 10);
}

TYPED_TEST(GatherImportTest, GatherBatchRaggedMatchesReference) {
  uint32_t seed = 600;
  for (const auto& c : kCases) this->run_batch(c, /*import=*/false, seed += 10);
}

TYPED_TEST(GatherImportTest, ImportBatchRaggedMatchesReference) {
  uint32_t seed = 900;
  for (const auto& c : kCases) this->run_batch(c, /*import=*/true, seed += 10);
}

}  // namespace
}  // namespace pagedkv::testing
