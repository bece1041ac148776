// write_kv and write_kv_all_layers against a naive reference, for every dtype and page layout.
#include <gtest/gtest.h>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

struct WriteCase {
  DType pool;
  DType input;
  PageLayout page_layout;
  int heads;
  int head_dim;
  int block_size;
  int tokens;
  int extra_stride;  // row stride = heads * head_dim + extra (odd values: unaligned rows)
  ScaleGranularity scales;
};

// Sampled, not a cross product: every dtype on both layouts, each odd shape at least once.
const WriteCase kCases[] = {
    {DType::kFloat16, DType::kFloat16, PageLayout::kNHD, 8, 128, 16, 37, 0,
     ScaleGranularity::kNone},
    {DType::kFloat16, DType::kFloat16, PageLayout::kHND, 3, 80, 8, 21, 5, ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kBFloat16, PageLayout::kHND, 1, 64, 1, 9, 3, ScaleGranularity::kNone},
    {DType::kBFloat16, DType::kFloat16, PageLayout::kNHD, 1, 256, 32, 40, 0,
     ScaleGranularity::kNone},
    {DType::kFloat32, DType::kFloat32, PageLayout::kNHD, 3, 80, 8, 19, 1, ScaleGranularity::kNone},
    {DType::kFloat32, DType::kBFloat16, PageLayout::kHND, 8, 96, 16, 23, 0,
     ScaleGranularity::kNone},
    {DType::kFloat16, DType::kFloat32, PageLayout::kHND, 8, 128, 16, 17, 2,
     ScaleGranularity::kNone},
    {DType::kFloat8E4M3, DType::kFloat16, PageLayout::kHND, 8, 96, 32, 45, 0,
     ScaleGranularity::kPerLayer},
    {DType::kFloat8E4M3, DType::kBFloat16, PageLayout::kNHD, 3, 256, 128, 30, 7,
     ScaleGranularity::kPerHead},
    {DType::kFloat8E4M3, DType::kFloat32, PageLayout::kNHD, 32, 64, 16, 20, 0,
     ScaleGranularity::kPerHead},
    {DType::kFloat8E4M3, DType::kFloat8E4M3, PageLayout::kHND, 3, 80, 8, 13, 1,
     ScaleGranularity::kNone},
    {DType::kFloat8E4M3, DType::kFloat16, PageLayout::kNHD, 1, 128, 1, 6, 0,
     ScaleGranularity::kNone},
    // Odd rows for the narrow shape's lanes (a power of two per row, up to a warp): chunks per
    // row not a power of two (idle lanes), more than 32 (a lane takes several; the step from
    // one of its chunks to the next crosses a head boundary or two), heads of 24, 14, 20 or 400
    // bytes (8-, 2-, 4-byte vectors), odd token counts.
    {DType::kFloat16, DType::kFloat16, PageLayout::kNHD, 5, 12, 8, 33, 0,
     ScaleGranularity::kNone},  // 24 B heads: 15 vectors of 8 B, 16 lanes
    {DType::kFloat16, DType::kFloat16, PageLayout::kHND, 3, 7, 4, 11, 0,
     ScaleGranularity::kNone},  // 14 B heads: 21 vectors of 2 B, 32 lanes
    {DType::kFloat32, DType::kFloat32, PageLayout::kNHD, 1, 5, 2, 7, 0,
     ScaleGranularity::kNone},  // 20 B: 5 vectors of 4 B, 8 lanes, 3 idle
    {DType::kBFloat16, DType::kBFloat16, PageLayout::kNHD, 6, 200, 16, 35, 0,
     ScaleGranularity::kNone},  // 150 vectors of 16 B: 4-5 per lane, step 256 elements
    {DType::kFloat16, DType::kFloat32, PageLayout::kNHD, 7, 40, 16, 3, 0,
     ScaleGranularity::kNone},  // 35 converted chunks of 8: 3 lanes take two
    {DType::kFloat8E4M3, DType::kFloat16, PageLayout::kNHD, 5, 24, 8, 31, 0,
     ScaleGranularity::kPerHead},  // 15 chunks of 8, vector conversion
    {DType::kFloat8E4M3, DType::kBFloat16, PageLayout::kHND, 3, 36, 8, 9, 1,
     ScaleGranularity::kPerHead},  // chunks of 4 (36 % 8 != 0): element conversion, 27 chunks
    {DType::kFloat8E4M3, DType::kFloat8E4M3, PageLayout::kNHD, 1, 24, 16, 5, 0,
     ScaleGranularity::kNone},  // 3 vectors of 8 B, 4 lanes
};

template <typename Tag>
class WriteKvTest : public BackendTest<Tag> {
 protected:
  void run_case(const WriteCase& c, bool all_layers, uint32_t seed) {
    Backend& be = this->backend();
    Shape s;
    s.layers = 3;
    s.heads = c.heads;
    s.head_dim = c.head_dim;
    s.block_size = c.block_size;
    s.page_layout = c.page_layout;
    s.dtype = c.pool;
    s.num_blocks = (2 * c.tokens + c.block_size - 1) / c.block_size + 2;
    SCOPED_TRACE(s.describe() + " input " + dtype_name(c.input) + (all_layers ? " all" : " one"));

    const int64_t row = int64_t{c.heads} * c.head_dim;
    const int64_t stride = row + c.extra_stride;
    const int64_t layer_stride = c.tokens * stride + 3;
    const int64_t in_elems = all_layers ? s.layers * layer_stride : c.tokens * stride;
    const size_t ies = dtype_size(c.input);
    auto key = random_values(in_elems, c.input, seed + 1);
    auto value = random_values(in_elems, c.input, seed + 2);
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed + 3);

    // Distinct slots over shuffled blocks, every seventh token skipped with -1.
    std::vector<int64_t> all_slots(size_t(s.num_blocks) * c.block_size);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), std::mt19937(seed + 4));
    std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + c.tokens);
    for (int t = 3; t < c.tokens; t += 7) slots[size_t(t)] = -1;
    auto ks = random_scales(s, c.scales, seed + 5);
    auto vs = random_scales(s, c.scales, seed + 6);
    const int layer = 1;

    // Reference.
    std::vector<uint8_t> want = pool0;
    const bool scaled = c.scales != ScaleGranularity::kNone;
    for (int l = 0; l < s.layers; ++l) {
      if (!all_layers && l != layer) continue;
      const int64_t lbase = all_layers ? l * layer_stride : 0;
      for (int t = 0; t < c.tokens; ++t) {
        const int64_t slot = slots[size_t(t)];
        if (slot < 0) continue;
        for (int part = 0; part < 2; ++part) {
          const auto& in = part == 0 ? key : value;
          for (int h = 0; h < c.heads; ++h) {
            const float sc = scale_of(part == 0 ? ks : vs, c.scales, s, l, h);
            for (int d = 0; d < c.head_dim; ++d) {
              ref_move(want.data(), s.dtype,
                       ref_index(s, slot / c.block_size, l, part, slot % c.block_size, h, d),
                       in.data(), c.input, lbase + t * stride + h * c.head_dim + d, sc, true,
                       scaled);
            }
          }
        }
      }
    }

    DeviceBuffer dk(be, key.size()), dv(be, value.size()), dslots(be, slots.size() * 8),
        dks(be, ks.size() * 4), dvs(be, vs.size() * 4), dpool(be, pool0.size());
    dk.upload(key);
    dv.upload(value);
    dslots.upload(slots);
    dks.upload(ks);
    dvs.upload(vs);
    PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    KvScales scales{static_cast<const float*>(dks.data()), static_cast<const float*>(dvs.data()),
                    c.scales};
    for (auto shape : all_launch_shapes()) {
      SCOPED_TRACE(shape_name(shape));
      LaunchShapeGuard guard(shape);
      dpool.upload(pool0);
      Status st;
      if (all_layers) {
        WriteKvAllLayersArgs a;
        a.key = dk.data();
        a.value = dv.data();
        a.input_dtype = c.input;
        a.row_stride = stride;
        a.layer_stride = layer_stride;
        a.num_tokens = c.tokens;
        a.slot_mapping = static_cast<const int64_t*>(dslots.data());
        a.scales = scales;
        st = write_kv_all_layers(be, pool, a);
      } else {
        WriteKvArgs a;
        a.key = dk.data();
        a.value = dv.data();
        a.input_dtype = c.input;
        a.row_stride = c.extra_stride == 0 ? 0 : stride;
        a.num_tokens = c.tokens;
        a.slot_mapping = static_cast<const int64_t*>(dslots.data());
        a.layer = layer;
        a.scales = scales;
        st = write_kv(be, pool, a);
      }
      ASSERT_OK(st);
      EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
    }
    (void)ies;
  }
};

TYPED_TEST_SUITE(WriteKvTest, AllBackends, BackendName);

TYPED_TEST(WriteKvTest, OneLayerMatchesReferenceForEveryDtypeAndLayout) {
  uint32_t seed = 100;
  for (const auto& c : kCases) this->run_case(c, /*all_layers=*/false, seed += 10);
}

TYPED_TEST(WriteKvTest, AllLayersMatchesReferenceForEveryDtypeAndLayout) {
  uint32_t seed = 900;
  for (const auto& c : kCases) this->run_case(c, /*all_layers=*/true, seed += 10);
}

TYPED_TEST(WriteKvTest, SliceOfFusedQkvWithUnalignedBase) {
  // K and V are column slices of a [tokens, (q + k + v) heads * dim] fp16 row, starting at an
  // element offset that is not 16-byte aligned: the host must fall back to narrower vectors.
  Backend& be = this->backend();
  Shape s;
  s.layers = 1;
  s.heads = 2;
  s.head_dim = 64;
  s.block_size = 16;
  s.num_blocks = 4;
  const int tokens = 10, q_heads = 3;
  const int64_t row = int64_t{q_heads + 2 * s.heads} * s.head_dim + 1;  // odd row: unaligned
  auto qkv = random_values(tokens * row + 1, DType::kFloat16, 7);
  std::vector<int64_t> slots;
  for (int t = 0; t < tokens; ++t) slots.push_back(63 - 5 * t);
  auto pool0 = random_bytes(size_t(s.pool_elems()) * 2, 8);
  std::vector<uint8_t> want = pool0;
  for (int t = 0; t < tokens; ++t)
    for (int part = 0; part < 2; ++part)
      for (int h = 0; h < s.heads; ++h)
        for (int d = 0; d < s.head_dim; ++d) {
          const int64_t src = 1 + t * row + (q_heads + part * s.heads + h) * s.head_dim + d;
          const int64_t dst =
              ref_index(s, slots[size_t(t)] / 16, 0, part, slots[size_t(t)] % 16, h, d);
          std::memcpy(&want[size_t(dst) * 2], &qkv[size_t(src) * 2], 2);
        }
  DeviceBuffer dqkv(be, qkv.size()), dslots(be, slots.size() * 8), dpool(be, pool0.size());
  dqkv.upload(qkv);
  dslots.upload(slots);
  dpool.upload(pool0);
  const auto* base = static_cast<const uint16_t*>(dqkv.data()) + 1;
  WriteKvArgs a;
  a.key = base + q_heads * s.head_dim;
  a.value = base + (q_heads + s.heads) * s.head_dim;
  a.row_stride = row;
  a.num_tokens = tokens;
  a.slot_mapping = static_cast<const int64_t*>(dslots.data());
  PoolRef pool{dpool.data(), DType::kFloat16, s.layout(), s.num_blocks};
  ASSERT_OK(write_kv(be, pool, a));
  EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
}

TYPED_TEST(WriteKvTest, OutOfRangeDeviceSlotsAreSkipped) {
  // Slots are device data the host cannot check: the kernel skips those past the pool.
  Backend& be = this->backend();
  Shape s;
  s.layers = 1;
  s.heads = 1;
  s.head_dim = 64;
  s.block_size = 8;
  s.num_blocks = 2;
  std::vector<int64_t> slots = {16, 1000000, -5, 3};
  auto key = random_values(4 * 64, DType::kFloat16, 1);
  auto pool0 = random_bytes(size_t(s.pool_elems()) * 2, 2);
  std::vector<uint8_t> want = pool0;
  for (int part = 0; part < 2; ++part)
    for (int d = 0; d < 64; ++d)
      std::memcpy(&want[size_t(ref_index(s, 0, 0, part, 3, 0, d)) * 2],
                  &key[size_t(3 * 64 + d) * 2], 2);
  DeviceBuffer dk(be, key.size()), dslots(be, 32), dpool(be, pool0.size());
  dk.upload(key);
  dslots.upload(slots);
  dpool.upload(pool0);
  WriteKvArgs a;
  a.key = dk.data();
  a.value = dk.data();
  a.num_tokens = 4;
  a.slot_mapping = static_cast<const int64_t*>(dslots.data());
  ASSERT_OK(write_kv(be, PoolRef{dpool.data(), DType::kFloat16, s.layout(), 2}, a));
  EXPECT_TRUE(bytes_equal(want, dpool.download<uint8_t>()));
}

}  // namespace
}  // namespace pagedkv::testing
