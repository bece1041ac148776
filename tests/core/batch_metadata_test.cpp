// Batch metadata: exact slot mapping, block tables with -1 padding, CSR, incremental rows.
#include <gtest/gtest.h>

#include "core/dense_allocator.hpp"
#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

TEST(BatchMetadata, SlotsTablesAndCsr) {
  CacheConfig c = tiny_config(4, 12);
  c.enable_prefix_caching = false;
  auto cp = make_cp(c);
  ASSERT_OK(cp->add_sequence(1, {}));
  ASSERT_OK(cp->add_sequence(2, {}));
  ASSERT_OK(cp->reserve(1, 6));  // blocks 0, 1
  ASSERT_OK(cp->reserve(2, 3));  // block 2
  BatchOptions o;
  o.build_csr = true;
  o.pad_slots_to = 12;
  auto md = cp->build_batch({2, 1}, o);
  ASSERT_OK(md);
  const BatchMetadata& b = **md;
  EXPECT_EQ(b.batch_size, 2);
  EXPECT_EQ(b.max_blocks, 2);
  EXPECT_EQ(b.slot_mapping, (std::vector<int64_t>{8, 9, 10, 0, 1, 2, 3, 4, 5, -1, -1, -1}));
  EXPECT_EQ(b.block_tables, (std::vector<int32_t>{2, -1, 0, 1}));
  EXPECT_EQ(b.seq_lens, (std::vector<int32_t>{3, 6}));
  EXPECT_EQ(b.indptr, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(b.indices, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_EQ(b.last_page_len, (std::vector<int32_t>{3, 2}));

  // Next step: one token each; sequence 1 grows to a third block: the table widens to 4.
  ASSERT_OK(cp->commit(1, iota_tokens(6, 0)));
  ASSERT_OK(cp->commit(2, iota_tokens(3, 0)));
  ASSERT_OK(cp->reserve(1, 3));  // positions 6..8: block 1 then new block 3
  ASSERT_OK(cp->reserve(2, 1));
  auto md2 = cp->build_batch({2, 1}, o);
  ASSERT_OK(md2);
  const BatchMetadata& b2 = **md2;
  EXPECT_EQ(b2.max_blocks, 4);
  EXPECT_EQ(b2.block_tables, (std::vector<int32_t>{2, -1, -1, -1, 0, 1, 3, -1}));
  EXPECT_EQ(b2.slot_mapping, (std::vector<int64_t>{11, 6, 7, 12, -1, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b2.last_page_len, (std::vector<int32_t>{4, 1}));

  // Rollback shrinks a row; a smaller batch drops rows; fork + copy-on-write rewrites a row.
  ASSERT_OK(cp->rollback(1, 2));
  ASSERT_OK(cp->fork(1, 3));
  auto r = cp->reserve(3, 1);
  ASSERT_OK(r);
  ASSERT_EQ(r->transfers.copies.size(), 1u);
  auto md3 = cp->build_batch({1, 3});
  ASSERT_OK(md3);
  const int32_t copy = r->transfers.copies[0].dst_block;
  EXPECT_EQ((*md3)->block_tables, (std::vector<int32_t>{0, -1, -1, -1, copy, -1, -1, -1}));
  EXPECT_EQ((*md3)->slot_mapping, (std::vector<int64_t>{copy * 4 + 2}));
  EXPECT_TRUE((*md3)->indices.empty());
  PAGEDKV_EXPECT_INV(*cp);
}

// The decode step's path (reserve_batch, build_batch, commit_batch) skips the sizing pass while
// the tables fit: a step whose reserve grows a row past the table's width must still widen it,
// on a plane of one group and on one whose window group shares the blocks.
void expect_rows_are_tables(ControlPlane* cp, const std::vector<SequenceId>& ids) {
  for (int32_t g = 0; g < cp->num_groups(); ++g) {
    const BatchMetadata& md = cp->group_batch(g);
    ASSERT_EQ(md.batch_size, static_cast<int32_t>(ids.size()));
    for (size_t r = 0; r < ids.size(); ++r) {
      const auto locs = cp->group_block_locations(ids[r], g);
      ASSERT_OK(locs);
      ASSERT_LE(locs->size(), static_cast<size_t>(md.max_blocks)) << "group " << g;
      for (int32_t i = 0; i < md.max_blocks; ++i) {
        const int32_t want = static_cast<size_t>(i) < locs->size() ? (*locs)[i].block : -1;
        EXPECT_EQ(md.block_tables[r * static_cast<size_t>(md.max_blocks) + i], want)
            << "group " << g << " row " << r << " entry " << i;
      }
    }
  }
}

TEST(BatchMetadata, DecodeStepsWidenTheTablesTheyOutgrow) {
  CacheConfig one = tiny_config(4, 64);
  CacheConfig groups = one;
  KvGroup window, full;
  window.name = "window";
  window.layers = {0};
  window.sliding_window = 8;
  window.num_device_blocks = 32;
  full.name = "full";
  full.layers = {1};
  full.num_device_blocks = 64;
  for (KvGroup* g : {&window, &full}) {
    g->num_kv_heads = groups.num_kv_heads;
    g->head_dim = groups.head_dim;
  }
  groups.groups = {window, full};
  for (const CacheConfig& c : {one, groups}) {
    auto cp = make_cp(c);
    const std::vector<SequenceId> ids = {1, 2};
    ASSERT_OK(cp->add_sequence(1, {}));
    ASSERT_OK(cp->add_sequence(2, {}));
    ReserveResult r;
    ASSERT_OK(cp->reserve_batch(ids, 3, &r));
    ASSERT_OK(cp->build_batch(ids));
    EXPECT_EQ(cp->group_batch(cp->full_group()).max_blocks, 1);
    TokenId t = 0;
    for (int step = 0; step < 12; ++step) {
      // Steps of 1 to 6 tokens: some begin one block, some two.
      const int64_t n = 1 + step % 6;
      const int64_t reserved = *cp->pending(1);
      std::vector<TokenId> toks(ids.size() * static_cast<size_t>(reserved));
      for (TokenId& x : toks) x = t++;
      ASSERT_OK(cp->commit_batch(ids, toks.data(), reserved));
      r.slots.clear();
      ASSERT_OK(cp->reserve_batch(ids, n, &r));
      ASSERT_OK(cp->build_batch(ids));
      expect_rows_are_tables(cp.get(), ids);
      PAGEDKV_EXPECT_INV(*cp);
      if (HasFailure()) return;
    }
    EXPECT_GE(cp->group_batch(cp->full_group()).max_blocks, 8);
  }
}

TEST(DenseAllocator, DoublesCapacityAndRecyclesBuffers) {
  CacheConfig c = tiny_config(4, 8);
  c.mode = CacheMode::kDense;
  c.dense_initial_length = 4;
  c.max_sequence_length = 20;
  c.dense_max_free_buffers = 1;
  auto d = DenseAllocator::create(c);
  ASSERT_OK(d);
  auto b = d->add(1);
  ASSERT_OK(b);
  EXPECT_EQ(b->buffer_id, 0);
  EXPECT_EQ(b->capacity, 4);
  auto g = d->append(1, 3);
  ASSERT_OK(g);
  EXPECT_FALSE(g->grew);
  g = d->append(1, 6);  // 9 tokens: 4 -> 8 -> 16
  ASSERT_OK(g);
  EXPECT_TRUE(g->grew);
  EXPECT_EQ(g->old_capacity, 4);
  EXPECT_EQ(g->new_capacity, 16);
  g = d->append(1, 11);  // 20: capped at max_sequence_length
  ASSERT_OK(g);
  EXPECT_EQ(g->new_capacity, 20);
  EXPECT_EQ(d->append(1, 1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*d->length(1), 20);
  EXPECT_EQ(d->rollback(1, 21).code(), StatusCode::kOutOfRange);
  ASSERT_OK(d->rollback(1, 5));
  EXPECT_EQ(d->add(1).status().code(), StatusCode::kAlreadyExists);
  ASSERT_OK(d->add(2));  // buffer 1
  ASSERT_OK(d->finish(1));
  ASSERT_OK(d->finish(2));  // the free list holds one: buffer 1 is released
  EXPECT_EQ(d->free_buffers(), 1);
  EXPECT_EQ(d->drain_released(), (std::vector<int64_t>{1}));
  auto b3 = d->add(3);  // recycles buffer 0 with its grown capacity
  ASSERT_OK(b3);
  EXPECT_EQ(b3->buffer_id, 0);
  EXPECT_EQ(b3->capacity, 20);
  EXPECT_EQ(*d->length(3), 0);
  EXPECT_EQ(d->finish(9).code(), StatusCode::kNotFound);
  c.dense_initial_length = 0;
  EXPECT_EQ(DenseAllocator::create(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
