// The row bodies' launch shape (ops_detail::row_lanes, plan_paged_rows) and the raw-copy body
// (PagedRowRawBody) against a naive reference: every lane count a row can get, both directions,
// odd shapes, bad device indices, the host's streaming stores, and the generic body on the same
// plans for comparison.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernel_test_util.hpp"
#include "kernels/paged_copy.hpp"
#include "kernels/registry.hpp"
#include "ops/ops_common.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

using ops_detail::kModelResidentThreads;
using ops_detail::row_lanes;

TEST(RowLanes, DecodeRowsGetALanePerVectorAndPrefillRowsAWarp) {
  // B = 256 tokens of one layer, K and V: 512 rows of 8 heads x 128 fp16, 128 vectors each.
  EXPECT_EQ(row_lanes(128, 512, kModelResidentThreads), 128);
  // The same tokens for 32 layers in one launch, or 8K prefill tokens: rows fill the device.
  EXPECT_EQ(row_lanes(128, 32 * 512, kModelResidentThreads), 32);
  EXPECT_EQ(row_lanes(128, 2 * 8192, kModelResidentThreads), 32);
}

TEST(RowLanes, GrowPastAWarpOnlyWhileTheRowsFitTheResidentThreads) {
  EXPECT_EQ(row_lanes(128, 1000, 1000 * 64), 64);
  EXPECT_EQ(row_lanes(128, 1000, 1000 * 64 - 1), 32);
  EXPECT_EQ(row_lanes(128, 1000, 1000 * 128), 128);
  EXPECT_EQ(row_lanes(128, 1000, 1000 * 1000), 128);  // never past one lane per chunk
  EXPECT_EQ(row_lanes(1000, 1, int64_t{1} << 40), kernels::kMaxRowLanes);
  EXPECT_EQ(row_lanes(5, 1, int64_t{1} << 40), 8);  // short rows keep the smallest cover
  EXPECT_EQ(row_lanes(5, 1, 1), 8);
  EXPECT_EQ(row_lanes(1, 7, 1), 1);
  EXPECT_EQ(row_lanes(0, 0, 0), 1);
  EXPECT_EQ(row_lanes(100, int64_t{1} << 62, int64_t{1} << 62), 32);  // no overflow
}

TEST(RowLanes, RandomSizesGiveAPowerOfTwoWithinTheBounds) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const int64_t segs = int64_t(rng() % 600) + 1;
    const int64_t rows = int64_t(rng() % (1 << 20)) + 1;
    const int64_t res = int64_t(rng() % (1 << 22)) + 1;
    const int64_t lanes = row_lanes(segs, rows, res);
    SCOPED_TRACE(std::to_string(segs) + " segs, " + std::to_string(rows) + " rows, " +
                 std::to_string(res) + " threads");
    ASSERT_EQ(lanes & (lanes - 1), 0) << lanes;
    ASSERT_LE(lanes, kernels::kMaxRowLanes);
    ASSERT_GE(lanes, std::min<int64_t>(segs, kernels::kWarpRowLanes));
    ASSERT_LT(lanes / 2, std::max<int64_t>(segs, 1));  // no power of two past the row's cover
    if (lanes > kernels::kWarpRowLanes) {
      ASSERT_LE(rows * lanes, res);
    }
    // More rows never get more lanes.
    ASSERT_LE(row_lanes(segs, rows + 1 + int64_t(rng() % 1000), res), lanes);
  }
}

PoolLayout decode_layout() {
  PoolLayout l;
  l.num_layers = 32;
  l.num_kv_heads = 8;
  l.head_dim = 128;
  l.block_size = 16;
  return l;
}

kernels::PagedRowBody decode_write_body(DType pool_dtype, DType input, int64_t tokens) {
  // Planning reads pointers for their alignment only: nothing is launched.
  PoolRef pool{reinterpret_cast<void*>(uintptr_t{1} << 20), pool_dtype, decode_layout(), 300};
  kernels::PagedRowBody b = ops_detail::make_row_body(pool);
  b.lin_k = reinterpret_cast<void*>(uintptr_t{1} << 24);
  b.lin_v = reinterpret_cast<void*>(uintptr_t{1} << 25);
  b.lin_dtype = input;
  b.lin_token_stride = 8 * 128;
  b.lin_head_stride = 128;
  b.mapping = kernels::RowMapping::kSlots;
  b.num_heads_op = 8;
  b.num_tokens = tokens;
  b.layer0 = 3;
  b.num_layers_op = 1;
  b.to_pool = 1;
  return b;
}

TEST(PlanPagedRows, DecodeWriteRunsTheRawBodyWithALanePerVector) {
  auto plan = ops_detail::plan_paged_rows(decode_write_body(DType::kFloat16, DType::kFloat16, 256),
                                          /*wide=*/false, kModelResidentThreads);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->kernel, KernelId::kPagedRowsRaw);
  EXPECT_EQ(plan->body.vec_bytes, 16);
  EXPECT_EQ(plan->body.seg_elems, 8);
  EXPECT_EQ(plan->body.segs_per_row, 128);
  EXPECT_EQ(plan->body.lane_shift, 7);
  EXPECT_EQ(plan->body.step_heads, 8);  // 128 lanes x 8 elements: the next chunk is 8 heads on
  EXPECT_EQ(plan->body.step_elems, 0);
  EXPECT_EQ(plan->items, 512 * 128);

  // Prefill-sized: a warp per row. Wide (the CPU): one index per row, the whole row its chunk.
  plan = ops_detail::plan_paged_rows(decode_write_body(DType::kFloat16, DType::kFloat16, 8192),
                                     false, kModelResidentThreads);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->body.lane_shift, 5);
  EXPECT_EQ(plan->items, 2 * 8192 * 32);
  plan = ops_detail::plan_paged_rows(decode_write_body(DType::kFloat16, DType::kFloat16, 256),
                                     /*wide=*/true, kModelResidentThreads);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->kernel, KernelId::kPagedRowsRaw);
  EXPECT_EQ(plan->body.lane_shift, 0);
  EXPECT_EQ(plan->body.seg_elems, 1024);
  EXPECT_EQ(plan->items, 512);

  // A conversion keeps the generic body, with the same lanes rule (8-element chunks).
  plan = ops_detail::plan_paged_rows(decode_write_body(DType::kBFloat16, DType::kFloat16, 256),
                                     false, kModelResidentThreads);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->kernel, KernelId::kPagedRows);
  EXPECT_EQ(plan->body.lane_shift, 7);
}

// Streaming stores (the host's whole-row shape only): into a pool from 32 MiB, out of one from
// 4 MiB a launch; never on the narrow (device) shape or a conversion.
TEST(PlanPagedRows, TheHostStreamsIntoLargePoolsAndLargeReadsOutOfThem) {
  const auto plan = [](kernels::PagedRowBody b, bool wide) {
    auto p = ops_detail::plan_paged_rows(b, wide, kModelResidentThreads);
    EXPECT_OK(p);
    return p.ok() ? p->body.stream_stores : -1;
  };
  // 300 blocks of 2 MiB (32 layers, K and V, 16 tokens of 2 KiB rows).
  kernels::PagedRowBody write = decode_write_body(DType::kFloat16, DType::kFloat16, 1);
  EXPECT_EQ(plan(write, true), 1);
  EXPECT_EQ(plan(write, false), 0);
  write.num_blocks = 15;  // 30 MiB
  EXPECT_EQ(plan(write, true), 0);
  write.num_blocks = 16;
  EXPECT_EQ(plan(write, true), 1);
  EXPECT_EQ(plan(decode_write_body(DType::kBFloat16, DType::kFloat16, 256), true), 0);
  // Reads: 2 KiB rows, K and V: 1,024 tokens are 4 MiB.
  kernels::PagedRowBody read = decode_write_body(DType::kFloat16, DType::kFloat16, 1023);
  read.to_pool = 0;
  EXPECT_EQ(plan(read, true), 0);
  read.num_tokens = 1024;
  EXPECT_EQ(plan(read, true), 1);
  EXPECT_EQ(plan(read, false), 0);
}

// copy_streaming against memcpy: whole lines at line-aligned destinations (streamed) and every
// other size and offset (the memcpy it falls back to); the bytes around are untouched.
TEST(CopyStreaming, CopiesExactlyTheBytesAtAnyOffsetAndSize) {
  std::mt19937 rng(41);
  std::vector<uint8_t> src(9000);
  for (uint8_t& x : src) x = static_cast<uint8_t>(rng());
  alignas(64) static uint8_t dst[9000 + 256];
  for (int i = 0; i < 3000; ++i) {
    const bool lines = i % 2 == 0;
    const size_t off = lines ? 64 * (rng() % 8) : rng() % 256;
    const size_t bytes = lines ? 64 * (rng() % 100) : rng() % 6000;
    const size_t from = rng() % 2000;
    std::memset(dst, 0xa5, sizeof(dst));
    kernels::detail::copy_streaming(reinterpret_cast<char*>(dst + off),
                                    reinterpret_cast<const char*>(src.data() + from), bytes);
    kernels::detail::fence_streaming();
    SCOPED_TRACE("offset " + std::to_string(off) + ", " + std::to_string(bytes) + " bytes");
    ASSERT_EQ(std::memcmp(dst + off, src.data() + from, bytes), 0);
    for (size_t k = 0; k < sizeof(dst); ++k) {
      if (k >= off && k < off + bytes) continue;
      ASSERT_EQ(dst[k], 0xa5) << "byte " << k;
    }
  }
}

struct RawCase {
  DType dtype;
  PageLayout page_layout;
  int heads;
  int head_dim;
  int block_size;
  int tokens;
  int extra_stride;  // linear row stride = heads * head_dim + extra (odd: narrower vectors)
};

// Odd head counts, heads whose bytes take 16-, 8-, 4- and 2-byte vectors, rows of 3 to 225
// vectors (lanes idle, one each, several each with a remainder past a batch of 4), block sizes
// 3, 5 and 16.
const RawCase kRawCases[] = {
    {DType::kFloat16, PageLayout::kNHD, 8, 128, 16, 37, 0},   // 128 x 16 B
    {DType::kFloat16, PageLayout::kHND, 3, 12, 5, 29, 0},     // 24 B heads: 9 x 8 B
    {DType::kBFloat16, PageLayout::kNHD, 5, 7, 3, 23, 0},     // 14 B heads: 35 x 2 B
    {DType::kFloat32, PageLayout::kHND, 7, 20, 16, 19, 1},    // odd stride: 140 x 4 B
    {DType::kFloat8E4M3, PageLayout::kNHD, 3, 20, 5, 31, 0},  // 20 B heads: 15 x 4 B
    {DType::kFloat16, PageLayout::kNHD, 9, 200, 3, 11, 0},    // 400 B heads: 225 x 16 B
    {DType::kFloat32, PageLayout::kNHD, 1, 3, 5, 9, 0},       // 12 B rows: 3 x 4 B
};

/// The plans a case runs: the wide shape, and the narrow one at every lane count from a warp
/// (or less) up to one lane per chunk.
struct PlanChoice {
  bool wide;
  int64_t resident_threads;
};
std::vector<PlanChoice> plan_choices(int64_t rows) {
  return {
      {true, 1}, {false, 1}, {false, rows * 64}, {false, rows * 128}, {false, int64_t{1} << 40}};
}

template <typename Tag>
class RawRowBodyTest : public BackendTest<Tag> {
 protected:
  // Runs `plan` with the given kernel (the raw body or the generic one) on the backend.
  Status launch(const ops_detail::PagedRowsPlan& plan, KernelId kernel) {
    if (plan.items == 0) return ok_status();
    const kernels::PagedRowRawBody raw{plan.body};
    KernelLaunch l;
    l.kernel = kernel;
    l.params = kernel == KernelId::kPagedRowsRaw ? static_cast<const void*>(&raw)
                                                 : static_cast<const void*>(&plan.body);
    l.params_size = kernels::kernel_params_size(kernel);
    l.num_items = plan.items;
    return this->backend().launch(l, Stream{});
  }

  // Tokens into one layer at their slots (some -1, negative or past the pool), every plan, both
  // bodies, against the reference.
  void write_case(const RawCase& c, uint32_t seed) {
    Backend& be = this->backend();
    Shape s;
    s.layers = 3;
    s.heads = c.heads;
    s.head_dim = c.head_dim;
    s.block_size = c.block_size;
    s.page_layout = c.page_layout;
    s.dtype = c.dtype;
    s.num_blocks = (c.tokens + c.block_size - 1) / c.block_size + 2;
    SCOPED_TRACE(s.describe() + " write");
    const int64_t row = int64_t{c.heads} * c.head_dim;
    const int64_t stride = row + c.extra_stride;
    const int layer = 2;
    auto key = random_bytes(size_t(c.tokens * stride) * s.esize(), seed + 1);
    auto value = random_bytes(key.size(), seed + 2);
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed + 3);
    std::vector<int64_t> slots(size_t(s.num_blocks) * c.block_size);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(seed + 4));
    slots.resize(size_t(c.tokens));
    const int64_t past = s.num_blocks * c.block_size;
    for (int t = 2; t < c.tokens; t += 5) slots[size_t(t)] = t % 3 == 0 ? -1 : -7;
    for (int t = 4; t < c.tokens; t += 9) slots[size_t(t)] = past + t;

    std::vector<uint8_t> want = pool0;
    const size_t es = s.esize();
    for (int t = 0; t < c.tokens; ++t) {
      const int64_t slot = slots[size_t(t)];
      if (slot < 0 || slot >= past) continue;
      for (int part = 0; part < 2; ++part) {
        const auto& in = part == 0 ? key : value;
        for (int h = 0; h < c.heads; ++h) {
          for (int d = 0; d < c.head_dim; ++d) {
            const int64_t di =
                ref_index(s, slot / c.block_size, layer, part, slot % c.block_size, h, d);
            std::memcpy(&want[size_t(di) * es], &in[size_t(t * stride + h * c.head_dim + d) * es],
                        es);
          }
        }
      }
    }

    DeviceBuffer dk(be, key.size()), dv(be, value.size()), dslots(be, slots.size() * 8),
        dpool(be, pool0.size());
    dk.upload(key);
    dv.upload(value);
    dslots.upload(slots);
    PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    kernels::PagedRowBody b = ops_detail::make_row_body(pool);
    b.lin_k = dk.data();
    b.lin_v = dv.data();
    b.lin_dtype = s.dtype;
    b.lin_token_stride = stride;
    b.lin_head_stride = c.head_dim;
    b.mapping = kernels::RowMapping::kSlots;
    b.slots = static_cast<const int64_t*>(dslots.data());
    b.num_heads_op = c.heads;
    b.num_tokens = c.tokens;
    b.layer0 = layer;
    b.num_layers_op = 1;
    b.to_pool = 1;
    run_plans(b, 2 * int64_t{c.tokens}, dpool, pool0, want);
  }

  // One layer's heads [head0, heads) of one sequence, positions pos0.. through a block table
  // (one entry -1, one past the pool, one row of the table short), out of the pool into a
  // poisoned token-major tensor.
  void gather_case(const RawCase& c, uint32_t seed) {
    Backend& be = this->backend();
    Shape s;
    s.layers = 2;
    s.heads = c.heads;
    s.head_dim = c.head_dim;
    s.block_size = c.block_size;
    s.page_layout = c.page_layout;
    s.dtype = c.dtype;
    const int64_t pos0 = 2;
    const int64_t table_len = (pos0 + c.tokens + c.block_size - 1) / c.block_size - 1;
    s.num_blocks = table_len + 2;
    SCOPED_TRACE(s.describe() + " gather");
    const int head0 = c.heads > 1 ? 1 : 0;
    const int nh = c.heads - head0;
    const int64_t stride = int64_t{nh} * c.head_dim + c.extra_stride;
    const int layer = 1;
    auto table = shuffled_blocks(s.num_blocks, table_len, seed);
    if (table_len > 1) table[1] = -1;
    if (table_len > 2) table[2] = int32_t(s.num_blocks + 3);
    auto pool0 = random_bytes(size_t(s.pool_elems()) * s.esize(), seed + 1);
    const size_t out_bytes = size_t(c.tokens * stride) * s.esize();
    auto poison = random_bytes(out_bytes, seed + 2);
    std::vector<uint8_t> want_k = poison, want_v = poison;
    const size_t es = s.esize();
    for (int t = 0; t < c.tokens; ++t) {
      const int64_t pos = pos0 + t;
      const int64_t bi = pos / c.block_size;
      if (bi >= table_len) continue;
      const int64_t block = table[size_t(bi)];
      if (block < 0 || block >= s.num_blocks) continue;
      for (int part = 0; part < 2; ++part) {
        auto& out = part == 0 ? want_k : want_v;
        for (int h = 0; h < nh; ++h) {
          for (int d = 0; d < c.head_dim; ++d) {
            const int64_t si = ref_index(s, block, layer, part, pos % c.block_size, head0 + h, d);
            std::memcpy(&out[size_t(t * stride + h * c.head_dim + d) * es], &pool0[size_t(si) * es],
                        es);
          }
        }
      }
    }
    std::vector<uint8_t> want = want_k;
    want.insert(want.end(), want_v.begin(), want_v.end());
    std::vector<uint8_t> out0 = poison;
    out0.insert(out0.end(), poison.begin(), poison.end());

    DeviceBuffer dpool(be, pool0.size()), dtable(be, table.size() * 4), dout(be, out0.size());
    dpool.upload(pool0);
    dtable.upload(table);
    PoolRef pool{dpool.data(), s.dtype, s.layout(), s.num_blocks};
    kernels::PagedRowBody b = ops_detail::make_row_body(pool);
    b.lin_k = dout.data();
    b.lin_v = static_cast<char*>(dout.data()) + out_bytes;
    b.lin_dtype = s.dtype;
    b.lin_token_stride = stride;
    b.lin_head_stride = c.head_dim;
    b.mapping = kernels::RowMapping::kTable;
    b.block_tables = static_cast<const int32_t*>(dtable.data());
    b.max_blocks = int32_t(table_len);
    b.pos0 = pos0;
    b.head0 = head0;
    b.num_heads_op = nh;
    b.num_tokens = c.tokens;
    b.layer0 = layer;
    b.num_layers_op = 1;
    b.to_pool = 0;
    run_plans(b, 2 * int64_t{c.tokens}, dout, out0, want);
  }

  // Every plan of `b`, with both bodies (the wide one with streaming stores and without):
  // `dst` starts as `dst0` and must end as `want`.
  void run_plans(const kernels::PagedRowBody& b, int64_t rows, DeviceBuffer& dst,
                 const std::vector<uint8_t>& dst0, const std::vector<uint8_t>& want) {
    for (const PlanChoice& choice : plan_choices(rows)) {
      auto plan = ops_detail::plan_paged_rows(b, choice.wide, choice.resident_threads);
      ASSERT_OK(plan);
      ASSERT_EQ(plan->kernel, KernelId::kPagedRowsRaw);
      for (int stream : {0, 1}) {
        if (stream == 1 && !choice.wide) continue;  // the host's whole-row shape only
        plan->body.stream_stores = stream;
        for (KernelId kernel : {KernelId::kPagedRowsRaw, KernelId::kPagedRows}) {
          SCOPED_TRACE(std::string(kernels::kernel_name(kernel)) +
                       (choice.wide ? " wide" : " narrow") + (stream ? " streaming" : "") + ", " +
                       std::to_string(1 << plan->body.lane_shift) + " lanes of " +
                       std::to_string(plan->body.segs_per_row) + " chunks");
          dst.upload(dst0);
          ASSERT_OK(launch(*plan, kernel));
          EXPECT_TRUE(bytes_equal(want, dst.download<uint8_t>()));
        }
      }
    }
  }
};

TYPED_TEST_SUITE(RawRowBodyTest, AllBackends, BackendName);

TYPED_TEST(RawRowBodyTest, WriteMatchesReferenceAtEveryLaneCount) {
  uint32_t seed = 300;
  for (const RawCase& c : kRawCases) this->write_case(c, seed += 10);
}

TYPED_TEST(RawRowBodyTest, GatherMatchesReferenceAtEveryLaneCount) {
  uint32_t seed = 700;
  for (const RawCase& c : kRawCases) this->gather_case(c, seed += 10);
}

}  // namespace
}  // namespace pagedkv::testing
