// The data-plane ops on a latent (MLA) pool (one page per layer, keys only, no values) against a
// naive reference written from the layout description: write_kv, write_kv_all_layers,
// scatter_head_range, gather / import (one sequence and a ragged batch) and copy_blocks, for
// every dtype, DeepSeek's 576 = 512 + 64 latent and odd widths, both launch shapes; and the bad
// calls a latent pool refuses (a value tensor, a malformed latent layout) with nothing changed.
#include <gtest/gtest.h>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

/// A latent pool: `layers` pages of [block_size][1][head_dim] per block.
struct LatentShape {
  int32_t layers = 3;
  int32_t head_dim = 576;
  int32_t rope_dim = 64;
  int32_t block_size = 16;
  PageLayout page_layout = PageLayout::kNHD;
  int64_t num_blocks = 8;
  DType dtype = DType::kFloat16;

  PoolLayout layout() const {
    PoolLayout l;
    l.num_layers = layers;
    l.num_kv_heads = 1;
    l.head_dim = head_dim;
    l.block_size = block_size;
    l.page_layout = page_layout;
    l.num_parts = 1;
    l.rope_dim = rope_dim;
    return l;
  }
  int64_t pool_elems() const { return num_blocks * layers * int64_t{block_size} * head_dim; }
  size_t pool_bytes() const { return size_t(pool_elems()) * dtype_size(dtype); }
  std::string describe() const {
    return std::string(dtype_name(dtype)) + (page_layout == PageLayout::kNHD ? " NHD" : " HND") +
           " layers=" + std::to_string(layers) + " dim=" + std::to_string(head_dim) +
           " rope=" + std::to_string(rope_dim) + " bs=" + std::to_string(block_size);
  }
};

/// Element index of dim `d` of the latent of (block, layer, pos): [blocks][layers][bs][dim].
int64_t latent_index(const LatentShape& s, int64_t block, int layer, int64_t pos, int d) {
  return ((block * s.layers + layer) * s.block_size + pos) * s.head_dim + d;
}

/// Random positive per-layer scales (per-head is the same array with one head).
std::vector<float> latent_scales(const LatentShape& s, ScaleGranularity g, uint32_t seed) {
  if (g == ScaleGranularity::kNone) return {};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.004f, 0.05f);
  std::vector<float> v(size_t(s.layers));
  for (auto& x : v) x = d(rng);
  return v;
}

struct LatentCase {
  DType pool;
  DType other;  // input of a write, packed side of a gather
  PageLayout page_layout;
  int head_dim;
  int rope_dim;
  int block_size;
  int tokens;
  int extra_stride;
  ScaleGranularity scales;
};

const LatentCase kCases[] = {
    {DType::kFloat16, DType::kFloat16, PageLayout::kNHD, 576, 64, 16, 37, 0,
     ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kBFloat16, PageLayout::kHND, 576, 64, 64, 70, 3,
     ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kFloat16, PageLayout::kNHD, 576, 64, 1, 9, 0,
     ScaleGranularity::kNone},
    {DType::kFloat32, DType::kBFloat16, PageLayout::kNHD, 37, 5, 3, 23, 1, ScaleGranularity::kNone},
    {DType::kFloat16, DType::kFloat32, PageLayout::kHND, 37, 5, 7, 19, 2, ScaleGranularity::kNone},
    {DType::kFloat32, DType::kFloat32, PageLayout::kNHD, 37, 5, 5, 17, 0, ScaleGranularity::kNone},
    {DType::kFloat8E4M3, DType::kFloat16, PageLayout::kNHD, 576, 64, 16, 30, 0,
     ScaleGranularity::kPerLayer},
    {DType::kFloat8E4M3, DType::kBFloat16, PageLayout::kHND, 37, 5, 5, 13, 1,
     ScaleGranularity::kPerHead},
    {DType::kFloat8E4M3, DType::kFloat8E4M3, PageLayout::kNHD, 37, 5, 4, 11, 0,
     ScaleGranularity::kNone},
};

LatentShape shape_of(const LatentCase& c) {
  LatentShape s;
  s.head_dim = c.head_dim;
  s.rope_dim = c.rope_dim;
  s.block_size = c.block_size;
  s.page_layout = c.page_layout;
  s.dtype = c.pool;
  return s;
}

template <typename Tag>
class LatentOpsTest : public BackendTest<Tag> {
 protected:
  void run_write(const LatentCase& c, bool all_layers, uint32_t seed) {
    Backend& be = this->backend();
    LatentShape s = shape_of(c);
    s.num_blocks = (2 * c.tokens + c.block_size - 1) / c.block_size + 2;
    SCOPED_TRACE(s.describe() + " input " + dtype_name(c.other) + (all_layers ? " all" : " one"));
    const int64_t stride = c.head_dim + c.extra_stride;
    const int64_t layer_stride = c.tokens * stride + 3;
    const int64_t in_elems = all_layers ? s.layers * layer_stride : c.tokens * stride;
    auto latent = random_values(in_elems, c.other, seed + 1);
    auto pool0 = random_bytes(s.pool_bytes(), seed + 2);
    std::vector<int64_t> all_slots(size_t(s.num_blocks) * c.block_size);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), std::mt19937(seed + 3));
    std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.tokens);
    for (int t = 3; t < c.tokens; t += 7) slots[size_t(t)] = -1;
    const auto scales = latent_scales(s, c.scales, seed + 4);
    const bool scaled = c.scales != ScaleGranularity::kNone;
    const int layer = 1;

    std::vector<uint8_t> want = pool0;
    for (int l = 0; l < s.layers; ++l) {
      if (!all_layers && l != layer) continue;
      const int64_t lbase = all_layers ? l * layer_stride : 0;
      const float sc = scaled ? scales[size_t(l)] : 1.0f;
      for (int t = 0; t < c.tokens; ++t) {
        const int64_t slot = slots[size_t(t)];
        if (slot < 0) continue;
        for (int d = 0; d < c.head_dim; ++d) {
          ref_move(want.data(), s.dtype,
                   latent_index(s, slot / c.block_size, l, slot % c.block_size, d), latent.data(),
                   c.other, lbase + t * stride + d, sc, true, scaled);
        }
      }
    }

    DeviceBuffer din(be, latent.size()), dslots(be, slots.size() * 8),
        dscales(be, std::max<size_t>(4, scales.size() * 4)), dpool(be, pool0.size());
    din.upload(latent);
    dslots.upload(slots);
    if (scaled) dscales.upload(scales);
    const PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    // A latent pool reads scales.k alone: scales.v stays null.
    const KvScales kv_scales{static_cast<const float*>(dscales.data()), nullptr, c.scales};
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dpool.upload(pool0);
      Status st;
      if (all_layers) {
        WriteKvAllLayersArgs a;
        a.key = din.data();
        a.input_dtype = c.other;
        a.row_stride = stride;
        a.layer_stride = layer_stride;
        a.num_tokens = c.tokens;
        a.slot_mapping = static_cast<const int64_t*>(dslots.data());
        a.scales = kv_scales;
        st = write_kv_all_layers(be, pool, a);
      } else {
        WriteKvArgs a;
        a.key = din.data();
        a.input_dtype = c.other;
        a.row_stride = c.extra_stride == 0 ? 0 : stride;
        a.num_tokens = c.tokens;
        a.slot_mapping = static_cast<const int64_t*>(dslots.data());
        a.layer = layer;
        a.scales = kv_scales;
        st = write_kv(be, pool, a);
      }
      ASSERT_OK(st);
      EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
    }
  }

  // Positions [p0, p0 + n) of one sequence over shuffled blocks, gathered out of or imported into
  // layer 2; a poisoned tail past the packed tensor must stay as it was.
  void run_single(const LatentCase& c, bool import, uint32_t seed) {
    Backend& be = this->backend();
    LatentShape s = shape_of(c);
    const int64_t nb = 5, p0 = c.block_size > 1 ? 2 : 1;
    const int64_t n = nb * c.block_size - p0 - 1;
    s.num_blocks = nb + 3;
    SCOPED_TRACE(s.describe() + " packed " + dtype_name(c.other) +
                 (import ? " import" : " gather"));
    const auto table = shuffled_blocks(s.num_blocks, nb, seed);
    const auto scales = latent_scales(s, c.scales, seed + 1);
    const bool scaled = c.scales != ScaleGranularity::kNone;
    const int layer = 2;
    const size_t pes = dtype_size(c.other);
    const int64_t tail = 5;  // elements past the packed tensor
    const auto pool0 = random_bytes(s.pool_bytes(), seed + 2);
    const auto packed0 = import ? random_values(n * c.head_dim + tail, c.other, seed + 3)
                                : random_bytes(size_t(n * c.head_dim + tail) * pes, seed + 3);
    std::vector<uint8_t> want_pool = pool0, want_packed = packed0;
    const float sc = scaled ? scales[size_t(layer)] : 1.0f;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = p0 + t;
      const int64_t pi =
          latent_index(s, table[size_t(pos / c.block_size)], layer, pos % c.block_size, 0);
      for (int d = 0; d < c.head_dim; ++d) {
        if (import) {
          ref_move(want_pool.data(), s.dtype, pi + d, packed0.data(), c.other, t * c.head_dim + d,
                   sc, true, scaled);
        } else {
          ref_move(want_packed.data(), c.other, t * c.head_dim + d, pool0.data(), s.dtype, pi + d,
                   sc, false, scaled);
        }
      }
    }
    DeviceBuffer dtable(be, table.size() * 4), dscales(be, std::max<size_t>(4, scales.size() * 4)),
        dpool(be, pool0.size()), dpacked(be, packed0.size());
    dtable.upload(table);
    if (scaled) dscales.upload(scales);
    const PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    for (auto packed_layout : {PackedLayout::kHeadMajor, PackedLayout::kTokenMajor}) {
      for (auto shape : all_launch_shapes()) {
        SCOPED_TRACE(shape_name(shape));
        LaunchShapeGuard guard(shape);
        dpool.upload(pool0);
        dpacked.upload(packed0);
        PackedLayerArgs a;
        a.key = dpacked.data();
        a.packed_dtype = c.other;
        a.packed_layout = packed_layout;  // one head: both orders are [len, dim]
        a.block_table = static_cast<const int32_t*>(dtable.data());
        a.block_table_len = int32_t(nb);
        a.layer = layer;
        a.position_begin = p0;
        a.num_tokens = n;
        a.scales = KvScales{static_cast<const float*>(dscales.data()), nullptr, c.scales};
        const Status st = import ? import_layer(be, pool, a) : gather_layer(be, pool, a);
        ASSERT_OK(st);
        EXPECT_TRUE(bytes_equal(want_pool, dpool.download<uint8_t>()));
        EXPECT_TRUE(bytes_equal(want_packed, dpacked.download<uint8_t>()));
      }
    }
  }

  // A ragged batch of three sequences (one empty) gathered in one launch.
  void run_batch(const LatentCase& c, uint32_t seed) {
    Backend& be = this->backend();
    LatentShape s = shape_of(c);
    const std::vector<int32_t> lens = {2 * c.block_size + 1, 0, c.block_size + 3};
    std::vector<int32_t> indptr = {0};
    int32_t max_blocks = 0;
    int64_t blocks_needed = 0;
    for (int32_t len : lens) {
      indptr.push_back(indptr.back() + len);
      const int32_t nb = (len + c.block_size - 1) / c.block_size;
      max_blocks = std::max(max_blocks, nb + 1);
      blocks_needed += nb;
    }
    s.num_blocks = blocks_needed + 2;
    SCOPED_TRACE(s.describe() + " batch packed " + dtype_name(c.other));
    const auto blocks = shuffled_blocks(s.num_blocks, blocks_needed, seed);
    std::vector<int32_t> tables(lens.size() * size_t(max_blocks), -1);
    size_t next = 0;
    for (size_t i = 0; i < lens.size(); ++i)
      for (int32_t j = 0; j < (lens[i] + c.block_size - 1) / c.block_size; ++j)
        tables[i * size_t(max_blocks) + size_t(j)] = blocks[next++];
    const int64_t total = indptr.back();
    const auto scales = latent_scales(s, c.scales, seed + 1);
    const bool scaled = c.scales != ScaleGranularity::kNone;
    const int layer = 0;
    const auto pool0 = random_bytes(s.pool_bytes(), seed + 2);
    const auto out0 = random_bytes(size_t(total * c.head_dim) * dtype_size(c.other), seed + 3);
    std::vector<uint8_t> want = out0;
    const float sc = scaled ? scales[size_t(layer)] : 1.0f;
    for (size_t i = 0; i < lens.size(); ++i)
      for (int32_t p = 0; p < lens[i]; ++p)
        for (int d = 0; d < c.head_dim; ++d)
          ref_move(want.data(), c.other, (indptr[i] + p) * int64_t{c.head_dim} + d, pool0.data(),
                   s.dtype,
                   latent_index(s, tables[i * size_t(max_blocks) + size_t(p / c.block_size)], layer,
                                p % c.block_size, d),
                   sc, false, scaled);
    DeviceBuffer dtables(be, tables.size() * 4), dindptr(be, indptr.size() * 4),
        dscales(be, std::max<size_t>(4, scales.size() * 4)), dpool(be, pool0.size()),
        dout(be, out0.size());
    dtables.upload(tables);
    dindptr.upload(indptr);
    dpool.upload(pool0);
    if (scaled) dscales.upload(scales);
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dout.upload(out0);
      PackedBatchArgs a;
      a.key = dout.data();
      a.packed_dtype = c.other;
      a.packed_layout = PackedLayout::kHeadMajor;
      a.block_tables = static_cast<const int32_t*>(dtables.data());
      a.max_blocks_per_seq = max_blocks;
      a.indptr = static_cast<const int32_t*>(dindptr.data());
      a.batch_size = int32_t(lens.size());
      a.total_tokens = total;
      a.layer = layer;
      a.scales = KvScales{static_cast<const float*>(dscales.data()), nullptr, c.scales};
      const Status st =
          gather_layer_batch(be, PoolRef{dpool.data(), s.dtype, s.layout(), s.num_blocks}, a);
      ASSERT_OK(st);
      EXPECT_TRUE(bytes_equal(want, dout.download<uint8_t>()));
    }
  }
};

TYPED_TEST_SUITE(LatentOpsTest, AllBackends, BackendName);

TYPED_TEST(LatentOpsTest, WriteKvOneLayerMatchesReference) {
  uint32_t seed = 100;
  for (const auto& c : kCases) this->run_write(c, /*all_layers=*/false, seed += 10);
}

TYPED_TEST(LatentOpsTest, WriteKvAllLayersMatchesReference) {
  uint32_t seed = 500;
  for (const auto& c : kCases) this->run_write(c, /*all_layers=*/true, seed += 10);
}

TYPED_TEST(LatentOpsTest, GatherLayerMatchesReference) {
  uint32_t seed = 900;
  for (const auto& c : kCases) this->run_single(c, /*import=*/false, seed += 10);
}

TYPED_TEST(LatentOpsTest, ImportLayerMatchesReference) {
  uint32_t seed = 1300;
  for (const auto& c : kCases) this->run_single(c, /*import=*/true, seed += 10);
}

TYPED_TEST(LatentOpsTest, GatherLayerBatchMatchesReference) {
  uint32_t seed = 1700;
  for (const auto& c : kCases) this->run_batch(c, seed += 10);
}

TYPED_TEST(LatentOpsTest, ScatterHeadRangeMatchesReference) {
  Backend& be = this->backend();
  LatentShape s;
  s.head_dim = 37;
  s.rope_dim = 5;
  s.block_size = 4;
  s.num_blocks = 6;
  const int64_t n = 9, p0 = 2;
  const auto table = shuffled_blocks(s.num_blocks, 3, 11);
  const auto in = random_values(n * s.head_dim, DType::kFloat16, 12);
  const auto pool0 = random_bytes(s.pool_bytes(), 13);
  std::vector<uint8_t> want = pool0;
  for (int64_t t = 0; t < n; ++t)
    for (int d = 0; d < s.head_dim; ++d)
      std::memcpy(
          &want[size_t(latent_index(s, table[size_t((p0 + t) / 4)], 1, (p0 + t) % 4, d)) * 2],
          &in[size_t(t * s.head_dim + d) * 2], 2);
  DeviceBuffer dtable(be, table.size() * 4), din(be, in.size()), dpool(be, pool0.size());
  dtable.upload(table);
  din.upload(in);
  for (auto shape : all_launch_shapes()) {
    SCOPED_TRACE(shape_name(shape));
    LaunchShapeGuard guard(shape);
    dpool.upload(pool0);
    ScatterHeadRangeArgs a;
    a.key = din.data();
    a.block_table = static_cast<const int32_t*>(dtable.data());
    a.block_table_len = 3;
    a.layer = 1;
    a.num_heads = 1;
    a.position_begin = p0;
    a.num_tokens = n;
    const Status st =
        scatter_head_range(be, PoolRef{dpool.data(), s.dtype, s.layout(), s.num_blocks}, a);
    ASSERT_OK(st);
    EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
  }
}

TYPED_TEST(LatentOpsTest, CopyBlocksCopiesWholeLatentBlocks) {
  Backend& be = this->backend();
  for (const auto& c : kCases) {
    LatentShape s = shape_of(c);
    s.num_blocks = 7;
    SCOPED_TRACE(s.describe());
    // A latent block is layers * block_size * head_dim elements: half a K/V block's.
    EXPECT_EQ(s.layout().block_elems(), int64_t{s.layers} * s.block_size * s.head_dim);
    const auto pool0 = random_bytes(s.pool_bytes(), 21);
    const std::vector<int64_t> pairs = {0, 5, 3, 1, 6, 2, 4, 99};  // the last pair is skipped
    const size_t block_bytes = size_t(s.layout().block_elems()) * dtype_size(s.dtype);
    std::vector<uint8_t> want = pool0;
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
      if (pairs[i + 1] >= s.num_blocks) continue;
      std::memcpy(&want[size_t(pairs[i + 1]) * block_bytes], &pool0[size_t(pairs[i]) * block_bytes],
                  block_bytes);
    }
    DeviceBuffer dpairs(be, pairs.size() * 8), dpool(be, pool0.size());
    dpairs.upload(pairs);
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dpool.upload(pool0);
      CopyBlocksArgs a;
      a.pairs = dpairs.data();
      a.index_type = IndexType::kInt64;
      a.num_pairs = int64_t(pairs.size() / 2);
      const Status st =
          copy_blocks(be, PoolRef{dpool.data(), s.dtype, s.layout(), s.num_blocks}, a);
      ASSERT_OK(st);
      EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
    }
  }
}

// Every op refuses a value tensor for a latent pool, before anything is queued: the pool and the
// output buffers keep their bytes.
TYPED_TEST(LatentOpsTest, ValueTensorIsRefusedAndNothingChanges) {
  Backend& be = this->backend();
  LatentShape s;
  s.head_dim = 37;
  s.rope_dim = 5;
  s.block_size = 4;
  s.num_blocks = 4;
  const auto pool0 = random_bytes(s.pool_bytes(), 31);
  const auto in = random_values(8 * s.head_dim, DType::kFloat16, 32);
  const std::vector<int64_t> slots = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int32_t> table = {3, 1}, indptr = {0, 8};
  DeviceBuffer dpool(be, pool0.size()), dk(be, in.size()), dv(be, in.size()),
      dslots(be, slots.size() * 8), dtable(be, 8), dindptr(be, 8);
  dpool.upload(pool0);
  dk.upload(in);
  dv.upload(in);
  dslots.upload(slots);
  dtable.upload(table);
  dindptr.upload(indptr);
  const PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
  const auto* slot_ptr = static_cast<const int64_t*>(dslots.data());
  const auto* table_ptr = static_cast<const int32_t*>(dtable.data());
  const std::string kWant = "value: a latent (MLA) cache stores no values; pass null";
  auto expect_refused = [&](const Status& st, const char* op) {
    SCOPED_TRACE(op);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), kWant);
    EXPECT_TRUE(bytes_equal(pool0, dpool.download<uint8_t>()));
    EXPECT_TRUE(bytes_equal(in, dv.download<uint8_t>()));
  };
  for (int64_t tokens : {int64_t{8}, int64_t{0}}) {  // refused even when there is nothing to move
    WriteKvArgs w;
    w.key = dk.data();
    w.value = dv.data();
    w.num_tokens = tokens;
    w.slot_mapping = slot_ptr;
    expect_refused(write_kv(be, pool, w), "write_kv");
    WriteKvAllLayersArgs wa;
    wa.key = dk.data();
    wa.value = dv.data();
    wa.num_tokens = tokens;
    wa.slot_mapping = slot_ptr;
    wa.layer_stride = 1;  // irrelevant: the value is refused first
    expect_refused(write_kv_all_layers(be, pool, wa), "write_kv_all_layers");
    PackedLayerArgs g;
    g.key = dk.data();
    g.value = dv.data();
    g.block_table = table_ptr;
    g.block_table_len = 2;
    g.num_tokens = tokens;
    expect_refused(gather_layer(be, pool, g), "gather_layer");
    expect_refused(import_layer(be, pool, g), "import_layer");
    PackedBatchArgs b;
    b.key = dk.data();
    b.value = dv.data();
    b.block_tables = table_ptr;
    b.max_blocks_per_seq = 2;
    b.indptr = static_cast<const int32_t*>(dindptr.data());
    b.batch_size = 1;
    b.total_tokens = tokens;
    expect_refused(gather_layer_batch(be, pool, b), "gather_layer_batch");
    expect_refused(import_layer_batch(be, pool, b), "import_layer_batch");
    ScatterHeadRangeArgs sc;
    sc.key = dk.data();
    sc.value = dv.data();
    sc.block_table = table_ptr;
    sc.block_table_len = 2;
    sc.num_heads = 1;
    sc.num_tokens = tokens;
    expect_refused(scatter_head_range(be, pool, sc), "scatter_head_range");
  }
  // The same calls with a null value succeed.
  WriteKvArgs w;
  w.key = dk.data();
  w.num_tokens = 8;
  w.slot_mapping = slot_ptr;
  EXPECT_OK(write_kv(be, pool, w));
}

TYPED_TEST(LatentOpsTest, MalformedLatentLayoutIsRefused) {
  Backend& be = this->backend();
  LatentShape s;
  s.head_dim = 37;
  s.rope_dim = 5;
  s.block_size = 4;
  s.num_blocks = 4;
  const auto pool0 = random_bytes(s.pool_bytes() * 2, 41);  // room for a K/V pool too
  const auto in = random_values(8 * s.head_dim, DType::kFloat16, 42);
  const std::vector<int64_t> slots = {0, 1, 2, 3, 4, 5, 6, 7};
  DeviceBuffer dpool(be, pool0.size()), dk(be, in.size()), dslots(be, slots.size() * 8);
  dpool.upload(pool0);
  dk.upload(in);
  dslots.upload(slots);
  WriteKvArgs w;
  w.key = dk.data();
  w.num_tokens = 8;
  w.slot_mapping = static_cast<const int64_t*>(dslots.data());
  struct Bad {
    const char* what;
    void (*edit)(PoolLayout&);
  };
  const Bad bad[] = {
      {"two heads", [](PoolLayout& l) { l.num_kv_heads = 2; }},
      {"rope_dim 0", [](PoolLayout& l) { l.rope_dim = 0; }},
      {"rope_dim == head_dim", [](PoolLayout& l) { l.rope_dim = l.head_dim; }},
      {"negative rope_dim", [](PoolLayout& l) { l.rope_dim = -1; }},
      {"three parts", [](PoolLayout& l) { l.num_parts = 3; }},
      {"K/V pool with a rope_dim", [](PoolLayout& l) { l.num_parts = 2; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    PoolLayout l = s.layout();
    b.edit(l);
    const Status st = write_kv(be, PoolRef{dpool.data(), s.dtype, l, s.num_blocks}, w);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind("pool.layout: ", 0), 0u) << st.message();
    EXPECT_TRUE(bytes_equal(pool0, dpool.download<uint8_t>()));
  }
  // A K/V pool still needs its value tensor.
  PoolLayout kv = s.layout();
  kv.num_parts = 2;
  kv.rope_dim = 0;
  const Status st = write_kv(be, PoolRef{dpool.data(), s.dtype, kv, s.num_blocks}, w);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("value: ", 0), 0u) << st.message();
  EXPECT_TRUE(bytes_equal(pool0, dpool.download<uint8_t>()));
}

}  // namespace
}  // namespace pagedkv::testing
