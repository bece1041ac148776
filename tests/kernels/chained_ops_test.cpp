// Chained ops: write, copy-on-write copy_blocks, write more into the copy, gather both
// sequences: the shared prefix and each sequence's own tokens come back as written.
#include <gtest/gtest.h>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

template <typename Tag>
class ChainedOpsTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(ChainedOpsTest, AllBackends, BackendName);

TYPED_TEST(ChainedOpsTest, WriteCopyOnWriteWriteGatherMatchesReference) {
  Backend& be = this->backend();
  for (PageLayout pl : {PageLayout::kNHD, PageLayout::kHND}) {
    Shape s;
    s.layers = 2;
    s.heads = 3;
    s.head_dim = 80;
    s.block_size = 8;
    s.page_layout = pl;
    s.num_blocks = 10;
    SCOPED_TRACE(s.describe());
    const int64_t row = s.heads * s.head_dim;
    // Sequence A: 12 tokens in blocks {7, 2}. Fork B shares block 7 and copies block 2 to 5
    // (copy-on-write of the partial block), then each writes 3 more tokens.
    const std::vector<int32_t> table_a = {7, 2}, table_b = {7, 5};
    auto first = random_values(2 * 12 * row, DType::kFloat16, 1);  // both layers, K
    auto first_v = random_values(2 * 12 * row, DType::kFloat16, 2);
    auto more_a = random_values(3 * row, DType::kFloat16, 3);
    auto more_b = random_values(3 * row, DType::kFloat16, 4);
    std::vector<int64_t> slots_first;
    for (int64_t p = 0; p < 12; ++p) slots_first.push_back(table_a[size_t(p / 8)] * 8 + p % 8);
    std::vector<int64_t> slots_a, slots_b;
    for (int64_t p = 12; p < 15; ++p) {
      slots_a.push_back(table_a[size_t(p / 8)] * 8 + p % 8);
      slots_b.push_back(table_b[size_t(p / 8)] * 8 + p % 8);
    }
    const std::vector<int32_t> pairs = {2, 5};

    DeviceBuffer dpool(be, size_t(s.pool_elems()) * 2), dfk(be, first.size()),
        dfv(be, first_v.size()), dma(be, more_a.size()), dmb(be, more_b.size()),
        dsf(be, slots_first.size() * 8), dsa(be, 24), dsb(be, 24), dpairs(be, 8), dta(be, 8),
        dtb(be, 8), dout(be, size_t(15 * row * 2));
    dpool.upload(random_bytes(size_t(s.pool_elems()) * 2, 9));
    dfk.upload(first);
    dfv.upload(first_v);
    dma.upload(more_a);
    dmb.upload(more_b);
    dsf.upload(slots_first);
    dsa.upload(slots_a);
    dsb.upload(slots_b);
    dpairs.upload(pairs);
    dta.upload(table_a);
    dtb.upload(table_b);
    PoolRef pool{dpool.data(), DType::kFloat16, s.layout(), s.num_blocks};

    WriteKvAllLayersArgs w;
    w.key = dfk.data();
    w.value = dfv.data();
    w.num_tokens = 12;
    w.slot_mapping = static_cast<const int64_t*>(dsf.data());
    ASSERT_OK(write_kv_all_layers(be, pool, w));
    CopyBlocksArgs cb;
    cb.pairs = dpairs.data();
    cb.num_pairs = 1;
    ASSERT_OK(copy_blocks(be, pool, cb));
    for (int layer = 0; layer < 2; ++layer) {
      WriteKvArgs a;
      a.key = dma.data();
      a.value = dma.data();
      a.num_tokens = 3;
      a.slot_mapping = static_cast<const int64_t*>(dsa.data());
      a.layer = layer;
      ASSERT_OK(write_kv(be, pool, a));
      a.key = dmb.data();
      a.value = dmb.data();
      a.slot_mapping = static_cast<const int64_t*>(dsb.data());
      ASSERT_OK(write_kv(be, pool, a));
    }
    // Gather layer 1 keys and values of both sequences, token-major: first 12 rows are the
    // shared prefix, the last 3 each sequence's own.
    for (int seq = 0; seq < 2; ++seq) {
      PackedLayerArgs g;
      g.key = dout.data();
      g.value = dout.data();  // values checked through keys' buffer below, separately
      g.packed_layout = PackedLayout::kTokenMajor;
      g.block_table = static_cast<const int32_t*>((seq == 0 ? dta : dtb).data());
      g.block_table_len = 2;
      g.layer = 1;
      g.num_tokens = 15;
      for (int part = 0; part < 2; ++part) {
        DeviceBuffer other(be, size_t(15 * row * 2));
        (part == 0 ? g.value : g.key) = other.data();
        dout.upload(std::vector<uint8_t>(dout.bytes(), 0xAB));  // poison
        ASSERT_OK(gather_layer(be, pool, g));
        auto got = dout.download<uint8_t>();
        std::vector<uint8_t> want(got.size());
        const auto& pre = part == 0 ? first : first_v;
        std::memcpy(want.data(), pre.data() + size_t(12 * row * 2),
                    size_t(12 * row * 2));  // layer 1
        std::memcpy(want.data() + size_t(12 * row * 2), (seq == 0 ? more_a : more_b).data(),
                    size_t(3 * row * 2));
        EXPECT_TRUE(bytes_equal(want, got)) << "seq " << seq << " part " << part;
        g.key = g.value = dout.data();
      }
    }
  }
}

}  // namespace
}  // namespace pagedkv::testing
