// Unit tests of the paged control plane on tiny pools: exact block ids, reuse, copy-on-write,
// eviction order, namespaces, rollback, fork. Invariants are checked after every step.
#include <gtest/gtest.h>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

TEST(ControlPlane, RejectsBadConfig) {
  CacheConfig c = tiny_config(4, 8);
  c.num_device_blocks = 0;
  auto r = ControlPlane::create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  c = tiny_config(4, 8);
  c.mode = CacheMode::kDense;
  EXPECT_EQ(ControlPlane::create(c).status().code(), StatusCode::kInvalidArgument);
}

TEST(ControlPlane, AllocatesLowestIdsAndMapsSlots) {
  auto cp = make_cp(tiny_config(4, 8));
  auto cached = cp->add_sequence(1, iota_tokens(10, 100));
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 0);
  auto r = cp->reserve(1, 10);
  ASSERT_OK(r);
  EXPECT_TRUE(r->transfers.empty());
  EXPECT_EQ(r->slots, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->commit(1, iota_tokens(10, 100)));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(device_blocks(*cp, 1), (std::vector<int32_t>{0, 1, 2}));
  const ControlStats st = cp->stats();
  EXPECT_EQ(st.device.free_blocks, 5);
  EXPECT_EQ(st.device.used_blocks, 3);
  EXPECT_EQ(st.device.cached_blocks, 0);
  EXPECT_EQ(st.device.used_bytes, 3 * 2 * 2 * 4 * 2 * 8 * 2);  // layers*KV*bs*heads*dim*fp16
  // Two full blocks were registered, chained.
  auto ev = cp->drain_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, EventKind::kBlockStored);
  EXPECT_EQ(ev[0].tokens, iota_tokens(4, 100));
  EXPECT_EQ(ev[1].tokens, iota_tokens(4, 104));
  EXPECT_EQ(ev[1].parent_hash, ev[0].block_hash);
  EXPECT_NE(ev[0].block_hash, ev[1].block_hash);
  EXPECT_TRUE(cp->drain_events().empty());
}

TEST(ControlPlane, PrefixReuseSharesFullBlocksOnly) {
  auto cp = make_cp(tiny_config(4, 8));
  add_and_fill(*cp, 1, iota_tokens(10, 100));
  std::vector<TokenId> p2 = iota_tokens(9, 100);
  p2[8] = 7;  // differs in the third block only
  auto cached = cp->add_sequence(2, p2);
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 8);
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{0, 1}));
  auto r = cp->reserve(2, 1);
  ASSERT_OK(r);
  EXPECT_TRUE(r->transfers.copies.empty());
  EXPECT_EQ(r->slots, (std::vector<int64_t>{3 * 4 + 0}));
  PAGEDKV_EXPECT_INV(*cp);
  const ControlStats st = cp->stats();
  EXPECT_EQ(st.prefix_hit_blocks, 2);
  EXPECT_EQ(st.prefix_hit_tokens, 8);
  EXPECT_EQ(st.prefix_query_tokens, 10 + 9);
}

// Seed defect 2: a fully cached prompt recomputes its last token into a copy, never into the
// shared cached block.
TEST(ControlPlane, FullPromptMatchCopiesOnWrite) {
  auto cp = make_cp(tiny_config(4, 8));
  add_and_fill(*cp, 1, iota_tokens(8, 100));
  ASSERT_OK(cp->finish(1));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->stats().device.cached_blocks, 2);
  auto cached = cp->add_sequence(2, iota_tokens(8, 100));
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 7);
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{0, 1}));
  auto r = cp->reserve(2, 1);
  ASSERT_OK(r);
  ASSERT_EQ(r->transfers.copies.size(), 1u);
  EXPECT_EQ(r->transfers.copies[0], (BlockCopy{1, 2}));
  EXPECT_EQ(r->slots, (std::vector<int64_t>{2 * 4 + 3}));
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{0, 2}));
  PAGEDKV_EXPECT_INV(*cp);
  // Completing the block finds the identical cached block and goes back to it.
  ASSERT_OK(cp->commit(2, std::vector<TokenId>{107}));
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(cp->stats().device.free_blocks, 6);
  EXPECT_EQ(cp->stats().copy_on_write, 1);
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(ControlPlane, ForkSharesBlocksAndCopiesOnWrite) {
  auto cp = make_cp(tiny_config(4, 8));
  add_and_fill(*cp, 1, iota_tokens(6, 100));
  ASSERT_OK(cp->fork(1, 2));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(*cp->length(2), 6);
  EXPECT_EQ(cp->stats().device.used_blocks, 2);
  auto r2 = cp->reserve(2, 1);
  ASSERT_OK(r2);
  ASSERT_EQ(r2->transfers.copies.size(), 1u);
  EXPECT_EQ(r2->transfers.copies[0], (BlockCopy{1, 2}));
  EXPECT_EQ(r2->slots, (std::vector<int64_t>{2 * 4 + 2}));
  // The parent is the only holder of block 1 now: it writes in place.
  auto r1 = cp->reserve(1, 1);
  ASSERT_OK(r1);
  EXPECT_TRUE(r1->transfers.copies.empty());
  EXPECT_EQ(r1->slots, (std::vector<int64_t>{1 * 4 + 2}));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->fork(1, 2).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cp->fork(9, 3).code(), StatusCode::kNotFound);
}

TEST(ControlPlane, RollbackFreesBlocksAndCopiesCachedTail) {
  auto cp = make_cp(tiny_config(4, 8));
  add_and_fill(*cp, 1, iota_tokens(12, 100));
  EXPECT_EQ(device_blocks(*cp, 1), (std::vector<int32_t>{0, 1, 2}));
  ASSERT_OK(cp->rollback(1, 5));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(device_blocks(*cp, 1), (std::vector<int32_t>{0, 1}));
  // Block 2 is cached (full when committed) and now unreferenced.
  EXPECT_EQ(cp->stats().device.cached_blocks, 1);
  EXPECT_EQ(cp->stats().device.free_blocks, 5);
  // Block 1 is cached: writing position 5 must copy it first (to the free block 3).
  auto r = cp->reserve(1, 1);
  ASSERT_OK(r);
  ASSERT_EQ(r->transfers.copies.size(), 1u);
  EXPECT_EQ(r->transfers.copies[0], (BlockCopy{1, 3}));
  EXPECT_EQ(r->slots, (std::vector<int64_t>{3 * 4 + 1}));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->rollback(1, 6).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp->rollback(1, -1).code(), StatusCode::kOutOfRange);
}

TEST(ControlPlane, RollbackWithoutCachingFreesToFreeList) {
  CacheConfig c = tiny_config(4, 8);
  c.enable_prefix_caching = false;
  auto cp = make_cp(c);
  add_and_fill(*cp, 1, iota_tokens(12, 100));
  ASSERT_OK(cp->rollback(1, 4));
  EXPECT_EQ(device_blocks(*cp, 1), (std::vector<int32_t>{0}));
  EXPECT_EQ(cp->stats().device.free_blocks, 7);
  // LIFO reuse: block 1 was released last.
  auto r = cp->reserve(1, 1);
  ASSERT_OK(r);
  EXPECT_EQ(r->slots, (std::vector<int64_t>{1 * 4}));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->finish(1));
  EXPECT_EQ(cp->stats().device.free_blocks, 8);
  PAGEDKV_EXPECT_INV(*cp);
}

// Three one-block prompts cached in order A, B, C; B is reused later, so LRU order is A, C, B.
TEST(ControlPlane, EvictsLeastRecentlyUsedCachedBlocks) {
  auto cp = make_cp(tiny_config(2, 4));
  add_and_fill(*cp, 1, {10, 11});
  add_and_fill(*cp, 2, {20, 21});
  add_and_fill(*cp, 3, {30, 31});
  // Finish leaves the one-token tail of a 2-token prompt cached (the block is full).
  ASSERT_OK(cp->finish(1));
  ASSERT_OK(cp->finish(2));
  ASSERT_OK(cp->finish(3));
  EXPECT_EQ(cp->stats().device.cached_blocks, 3);
  auto cached = cp->add_sequence(4, {20, 21, 22});
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 2);
  ASSERT_OK(cp->finish(4));
  PAGEDKV_EXPECT_INV(*cp);
  cp->drain_events();
  auto add = cp->add_sequence(5, {});
  ASSERT_OK(add);
  auto r = cp->reserve(5, 6);  // 3 blocks: the free block 3, then evict A (0), then C (2)
  ASSERT_OK(r);
  EXPECT_EQ(device_blocks(*cp, 5), (std::vector<int32_t>{3, 0, 2}));
  EXPECT_EQ(cp->stats().blocks_evicted, 2);
  auto ev = cp->drain_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, EventKind::kBlockRemoved);
  PAGEDKV_EXPECT_INV(*cp);
  // B survived: its prefix still matches.
  auto c6 = cp->add_sequence(6, {20, 21, 9});
  ASSERT_OK(c6);
  EXPECT_EQ(*c6, 2);
}

TEST(ControlPlane, RetentionPriorityAndExpiry) {
  FakeClock fc;
  auto cp = make_cp(tiny_config(2, 3), fc.clock());
  SequenceOptions keep;
  keep.retention_priority = 80;
  keep.retention_duration_ns = 100;
  add_and_fill(*cp, 1, {10, 11}, keep);  // block 0, high retention until t=1100+100
  add_and_fill(*cp, 2, {20, 21});        // block 1
  add_and_fill(*cp, 3, {30, 31});        // block 2
  ASSERT_OK(cp->finish(1));
  ASSERT_OK(cp->finish(2));
  ASSERT_OK(cp->finish(3));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->add_sequence(4, {}));
  auto r = cp->reserve(4, 2);  // one block: the default-priority LRU block 1, not block 0
  ASSERT_OK(r);
  EXPECT_EQ(device_blocks(*cp, 4), (std::vector<int32_t>{1}));
  PAGEDKV_EXPECT_INV(*cp);
  // After expiry block 0 is back at the default priority and is older than block 2.
  *fc.now += 200;
  ASSERT_OK(cp->add_sequence(5, {}));
  auto r5 = cp->reserve(5, 2);
  ASSERT_OK(r5);
  EXPECT_EQ(device_blocks(*cp, 5), (std::vector<int32_t>{0}));
  PAGEDKV_EXPECT_INV(*cp);
  SequenceOptions bad;
  bad.retention_priority = 101;
  EXPECT_EQ(cp->add_sequence(6, {1}, bad).status().code(), StatusCode::kInvalidArgument);
}

// A chain P -> C released before an unrelated X: C goes first (leaf), then P (its parent,
// older than X), then X.
TEST(ControlPlane, EvictsLeavesBeforeParents) {
  auto cp = make_cp(tiny_config(2, 4));
  add_and_fill(*cp, 1, {1, 2, 3, 4});  // blocks 0 (P), 1 (C)
  ASSERT_OK(cp->finish(1));
  add_and_fill(*cp, 2, {7, 8});  // block 2 (X)
  ASSERT_OK(cp->finish(2));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->add_sequence(3, {}));
  ASSERT_OK(cp->reserve(3, 2 * 2));  // free block 3, then C (1)
  EXPECT_EQ(device_blocks(*cp, 3), (std::vector<int32_t>{3, 1}));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->reserve(3, 3 * 2));  // then P (0)
  EXPECT_EQ(device_blocks(*cp, 3), (std::vector<int32_t>{3, 1, 0}));
  ASSERT_OK(cp->reserve(3, 4 * 2));  // then X (2)
  EXPECT_EQ(device_blocks(*cp, 3), (std::vector<int32_t>{3, 1, 0, 2}));
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(ControlPlane, NamespacesNeverShareBlocks) {
  auto cp = make_cp(tiny_config(4, 8));
  SequenceOptions a;
  a.ns = 1;
  SequenceOptions b;
  b.ns = 2;
  add_and_fill(*cp, 1, iota_tokens(9, 0), a);
  auto c2 = cp->add_sequence(2, iota_tokens(9, 0), b);
  ASSERT_OK(c2);
  EXPECT_EQ(*c2, 0);
  auto c3 = cp->add_sequence(3, iota_tokens(9, 0), a);
  ASSERT_OK(c3);
  EXPECT_EQ(*c3, 8);
  auto c4 = cp->add_sequence(4, iota_tokens(9, 0));  // namespace 0
  ASSERT_OK(c4);
  EXPECT_EQ(*c4, 0);
  PAGEDKV_EXPECT_INV(*cp);
}

// Seed defect 6: a prefix outlives the sequence that computed it.
TEST(ControlPlane, PrefixSurvivesFinish) {
  auto cp = make_cp(tiny_config(4, 8));
  add_and_fill(*cp, 1, iota_tokens(9, 50));
  ASSERT_OK(cp->finish(1));
  EXPECT_FALSE(cp->contains(1));
  auto c = cp->add_sequence(2, iota_tokens(10, 50));
  ASSERT_OK(c);
  EXPECT_EQ(*c, 8);
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{0, 1}));
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(ControlPlane, EraseDropsItsCachedBlocks) {
  auto cp = make_cp(tiny_config(4, 8));
  add_and_fill(*cp, 1, iota_tokens(9, 50));
  ASSERT_OK(cp->erase(1));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->stats().device.free_blocks, 8);
  EXPECT_EQ(cp->stats().device.cached_blocks, 0);
  auto c = cp->add_sequence(2, iota_tokens(10, 50));
  ASSERT_OK(c);
  EXPECT_EQ(*c, 0);
}

// Seed defect 5: FIFO means arrival order, not the smallest id.
TEST(ControlPlane, FifoDropsFirstArrivalNotSmallestId) {
  CacheConfig c = tiny_config(2, 4, 0, EvictionPolicy::kFifo);
  c.enable_prefix_caching = false;
  auto cp = make_cp(c);
  add_and_fill(*cp, 9, {1, 2, 3});  // blocks 0, 1
  add_and_fill(*cp, 3, {4, 5});     // block 2
  ASSERT_OK(cp->add_sequence(5, {}));
  ASSERT_OK(cp->set_active({5}));
  // Touching 9 later does not matter for FIFO.
  ASSERT_OK(cp->reserve(9, 1));
  auto r = cp->reserve(5, 4);  // 2 blocks: free block 3, then drop 9
  ASSERT_OK(r);
  EXPECT_EQ(r->transfers.evicted, (std::vector<SequenceId>{9}));
  EXPECT_FALSE(cp->contains(9));
  EXPECT_TRUE(cp->contains(3));
  EXPECT_EQ(cp->stats().sequences_evicted, 1);
  PAGEDKV_EXPECT_INV(*cp);
  auto ev = cp->drain_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, EventKind::kSequenceEvicted);
  EXPECT_EQ(ev[0].sequence, 9u);
}

TEST(ControlPlane, LruDropsLowestPriorityThenLeastRecentlyUsed) {
  CacheConfig c = tiny_config(2, 4);
  c.enable_prefix_caching = false;
  auto cp = make_cp(c);
  add_and_fill(*cp, 1, {1, 2});  // block 0
  add_and_fill(*cp, 2, {3, 4});  // block 1
  add_and_fill(*cp, 3, {5, 6});  // block 2
  ASSERT_OK(cp->set_priority(1, 5));
  ASSERT_OK(cp->reserve(2, 0));  // 2 is now more recent than 3
  ASSERT_OK(cp->add_sequence(4, {}));
  ASSERT_OK(cp->set_active({4}));
  auto r = cp->reserve(4, 6);  // 3 blocks: free 3, drop 3 (LRU at priority 0), then 2
  ASSERT_OK(r);
  EXPECT_EQ(r->transfers.evicted, (std::vector<SequenceId>{3, 2}));
  // Drops are applied before allocation; the free stack is LIFO: 1 (from 2), 2 (from 3), 3.
  EXPECT_EQ(device_blocks(*cp, 4), (std::vector<int32_t>{1, 2, 3}));
  PAGEDKV_EXPECT_INV(*cp);
  // Only the active sequence and the priority-5 one remain; 4 more blocks cannot be found.
  ASSERT_OK(cp->set_active({4, 1}));
  auto fail = cp->reserve(4, 8);
  EXPECT_EQ(fail.status().code(), StatusCode::kResourceExhausted);
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(ControlPlane, PolicyNoneNeverTakesFromSequences) {
  CacheConfig c = tiny_config(2, 2, 0, EvictionPolicy::kNone);
  auto cp = make_cp(c);
  add_and_fill(*cp, 1, {1, 2, 3});
  ASSERT_OK(cp->add_sequence(2, {}));
  EXPECT_EQ(cp->reserve(2, 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(cp->contains(1));
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(ControlPlane, OffloadsToHostThenRestores) {
  CacheConfig c = tiny_config(2, 4, 4);
  auto cp = make_cp(c);
  add_and_fill(*cp, 1, {1, 2, 3, 4, 5});  // blocks 0, 1, 2
  ASSERT_OK(cp->add_sequence(2, {}));
  ASSERT_OK(cp->set_active({2}));
  auto r = cp->reserve(2, 4);  // 2 blocks: free 3, then offload 1 (3 blocks to host 0, 1, 2)
  ASSERT_OK(r);
  EXPECT_EQ(r->transfers.offloaded, (std::vector<SequenceId>{1}));
  ASSERT_EQ(r->transfers.moves.size(), 3u);
  EXPECT_EQ(r->transfers.moves[0], (BlockMove{Tier::kDevice, 0, Tier::kHost, 0}));
  EXPECT_EQ(r->transfers.moves[2], (BlockMove{Tier::kDevice, 2, Tier::kHost, 2}));
  // The offloaded blocks are pushed on the free stack after block 3: LIFO hands out 2, then 1.
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{2, 1}));
  auto res = cp->residency(1);
  ASSERT_OK(res);
  EXPECT_EQ(res->host_blocks, 3);
  EXPECT_EQ(res->device_blocks, 0);
  EXPECT_TRUE(res->offloaded);
  EXPECT_EQ(cp->stats().host.used_blocks, 3);
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->commit(1, {9}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cp->build_batch({1}).status().code(), StatusCode::kFailedPrecondition);
  // Restore needs 3 device blocks; 2 are free.
  ASSERT_OK(cp->finish(2));
  auto back = cp->restore(1);
  ASSERT_OK(back);
  ASSERT_EQ(back->moves.size(), 3u);
  EXPECT_EQ(back->moves[0].src_tier, Tier::kHost);
  EXPECT_EQ(back->moves[0].src_block, 0);
  EXPECT_EQ(back->moves[0].dst_tier, Tier::kDevice);
  EXPECT_EQ(cp->stats().host.free_blocks, 4);
  EXPECT_EQ(cp->stats().sequences_restored, 1);
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->restore(1).status().code(), StatusCode::kFailedPrecondition);
}

// Seed defect 1: offloading keeps the prefix entries but they point at the host copy, so a
// block handed to another sequence is never matched by the old prefix; a new prompt matches the
// host copy and its first reserve brings that copy back.
TEST(ControlPlane, OffloadedPrefixNeverMatchesReusedBlocks) {
  CacheConfig c = tiny_config(2, 4, 4);
  auto cp = make_cp(c);
  add_and_fill(*cp, 1, {1, 2, 3, 4, 5});  // blocks 0, 1 cached, 2 partial
  auto off = cp->offload(1);
  ASSERT_OK(off);
  EXPECT_EQ(off->moves.size(), 3u);
  PAGEDKV_EXPECT_INV(*cp);
  add_and_fill(*cp, 2, {7, 7, 7, 7, 7, 7, 7});  // reuses device blocks 2, 1, 0, 3 (LIFO)
  EXPECT_EQ(device_blocks(*cp, 2), (std::vector<int32_t>{2, 1, 0, 3}));
  const std::vector<BlockLocation> host1 = *cp->block_locations(1);
  auto c3 = cp->add_sequence(3, {1, 2, 3, 4, 6});
  ASSERT_OK(c3);
  EXPECT_EQ(*c3, 4);  // the host copies of blocks 0 and 1, not device blocks 0 and 1
  const std::vector<BlockLocation> loc3 = *cp->block_locations(3);
  ASSERT_EQ(loc3.size(), 2u);
  EXPECT_EQ(loc3[0], host1[0]);
  EXPECT_EQ(loc3[1], host1[1]);
  EXPECT_EQ(loc3[0].tier, Tier::kHost);
  EXPECT_TRUE(cp->residency(3)->offloaded);
  EXPECT_EQ(cp->stats().prefix_host_hit_blocks, 2);
  PAGEDKV_EXPECT_INV(*cp);
  // The first reserve onboards them (evicting or offloading to make room), then copies the
  // partly reused block on write.
  ASSERT_OK(cp->finish(2));
  auto r3 = cp->reserve(3, 1);
  ASSERT_OK(r3);
  EXPECT_EQ(r3->transfers.restored, (std::vector<SequenceId>{3}));
  int64_t onboarded = 0;
  for (const BlockMove& m : r3->transfers.moves) {
    if (m.dst_tier == Tier::kDevice) {
      EXPECT_TRUE(m.src_block == host1[0].block || m.src_block == host1[1].block);
      ++onboarded;
    }
  }
  EXPECT_EQ(onboarded, 2);
  EXPECT_FALSE(cp->residency(3)->offloaded);
  EXPECT_EQ(cp->residency(3)->host_blocks, 0);
  PAGEDKV_EXPECT_INV(*cp);
}

// Seed defect 9: a multi-block reservation that cannot be met evicts nothing.
TEST(ControlPlane, FailedReservationChangesNothing) {
  auto cp = make_cp(tiny_config(2, 4));
  add_and_fill(*cp, 1, {1, 2, 3, 4});
  ASSERT_OK(cp->finish(1));  // 2 cached blocks, 2 free
  ASSERT_OK(cp->add_sequence(2, {}));
  ASSERT_OK(cp->set_active({2}));
  cp->drain_events();
  const Snapshot before = snapshot(*cp, {2});
  auto r = cp->reserve(2, 9);  // 5 blocks, only 4 obtainable
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(snapshot(*cp, {2}), before);
  EXPECT_TRUE(cp->drain_events().empty());
  PAGEDKV_EXPECT_INV(*cp);
  auto c = cp->add_sequence(3, {1, 2, 3, 4, 5});
  ASSERT_OK(c);
  EXPECT_EQ(*c, 4);
}

TEST(ControlPlane, CommitAndReserveBounds) {
  CacheConfig c = tiny_config(4, 8);
  c.max_sequence_length = 10;
  auto cp = make_cp(c);
  ASSERT_OK(cp->add_sequence(1, iota_tokens(3, 0)));
  EXPECT_EQ(*cp->length(1), 0);
  EXPECT_EQ(cp->reserve(1, 11).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp->reserve(1, -1).status().code(), StatusCode::kInvalidArgument);
  ASSERT_OK(cp->reserve(1, 2));
  EXPECT_EQ(cp->commit(1, iota_tokens(3, 0)).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(cp->commit(1, iota_tokens(1, 0)));
  EXPECT_EQ(*cp->pending(1), 1);
  // A smaller reservation releases the extra block.
  ASSERT_OK(cp->reserve(1, 0));
  EXPECT_EQ(cp->stats().device.used_blocks, 1);
  EXPECT_EQ(cp->add_sequence(2, iota_tokens(11, 0)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cp->add_sequence(1, {}).status().code(), StatusCode::kAlreadyExists);
  PAGEDKV_EXPECT_INV(*cp);
}

TEST(ControlPlane, StatsCountTiersAndSequences) {
  auto cp = make_cp(tiny_config(4, 8, 4));
  add_and_fill(*cp, 1, iota_tokens(9, 0));
  add_and_fill(*cp, 2, iota_tokens(5, 100));
  ASSERT_OK(cp->set_active({2}));
  const ControlStats st = cp->stats();
  EXPECT_EQ(st.device.total_blocks, 8);
  EXPECT_EQ(st.device.used_blocks, 5);
  EXPECT_EQ(st.device.free_blocks, 3);
  EXPECT_EQ(st.host.total_blocks, 4);
  EXPECT_EQ(st.host.free_blocks, 4);
  EXPECT_EQ(st.sequences, 2);
  EXPECT_EQ(st.active_sequences, 1);
  EXPECT_EQ(st.prefix_queries, 2);
  EXPECT_EQ(st.prefix_miss_blocks, 3);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
