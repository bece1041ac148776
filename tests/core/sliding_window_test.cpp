// Sliding-window caches (CacheConfig::sliding_window): blocks that fall out of the window are
// released at commit and stay as evictable prefix cache, so a decoding sequence holds a bounded
// number of blocks; prefix hits need only the blocks inside the window of the hit length;
// fork, offload/restore, rollback, slot() and build_batch see released entries as -1; a bad
// window is refused. Random operations are in sliding_window_random_test.cpp. Invariants are
// checked after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/status_matchers.hpp"
#include "window_test_util.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

// ---------------------------------------------------------------- 1. memory bound

struct BoundCase {
  int32_t window;
  int32_t block_size;
};

class WindowMemoryBound : public ::testing::TestWithParam<BoundCase> {};

// Prefill then hundreds of single-token decode steps for several sequences in a pool that full
// attention would exhaust: every sequence holds at most ceil(W / bs) + 1 blocks at every step,
// the pool's used blocks stay within that per sequence, and window_released_blocks counts the
// released entries.
TEST_P(WindowMemoryBound, DecodeHoldsAtMostTheWindowsBlocks) {
  const int64_t w = GetParam().window;
  const int64_t bs = GetParam().block_size;
  const int kSeqs = 6;
  const int kPrompt = 3 * static_cast<int>(w) + 5;
  const int kSteps = 300;
  const int64_t bound = decode_bound(w, bs);
  // Room for every sequence's window plus one prefill in flight, nothing more.
  const int64_t pool = kSeqs * bound + ceil_div(kPrompt, bs) + 1;
  auto cp = make_cp(window_config(static_cast<int32_t>(bs), static_cast<int32_t>(w), pool));
  for (SequenceId id = 1; id <= kSeqs; ++id) {
    const std::vector<TokenId> prompt = iota_tokens(kPrompt, static_cast<TokenId>(id * 100000));
    EXPECT_EQ(add_and_fill(*cp, id, prompt), 0);
    PAGEDKV_EXPECT_INV(*cp);
    ASSERT_TRUE(table_shape(*cp, id, w, bs));
    EXPECT_LE(held(*cp, id), bound);
  }
  for (int step = 0; step < kSteps; ++step) {
    for (SequenceId id = 1; id <= kSeqs; ++id) {
      auto r = cp->reserve(id, 1);
      ASSERT_OK(r) << "step " << step << " sequence " << id;
      PAGEDKV_EXPECT_INV(*cp);
      ASSERT_TRUE(table_shape(*cp, id, w, bs));
      ASSERT_LE(held(*cp, id), bound) << "step " << step << " (reserved)";
      const TokenId t = static_cast<TokenId>(id * 100000 + kPrompt + step);
      ASSERT_OK(cp->commit(id, &t, 1));
      PAGEDKV_EXPECT_INV(*cp);
      ASSERT_TRUE(table_shape(*cp, id, w, bs));
      ASSERT_LE(held(*cp, id), bound) << "step " << step << " (committed)";
    }
    const ControlStats st = cp->stats();
    ASSERT_LE(st.device.used_blocks, kSeqs * bound) << "step " << step;
    int64_t released_entries = 0;
    for (SequenceId id = 1; id <= kSeqs; ++id) released_entries += released(*cp, id);
    ASSERT_EQ(st.window_released_blocks, released_entries) << "step " << step;
    ASSERT_EQ(st.sequences_evicted, 0);
  }
  // The released blocks stayed cached until the pool needed them.
  EXPECT_GT(cp->stats().blocks_evicted, 0);
  for (SequenceId id = 1; id <= kSeqs; ++id) {
    EXPECT_EQ(*cp->length(id), kPrompt + kSteps);
    ASSERT_OK(cp->finish(id));
    PAGEDKV_EXPECT_INV(*cp);
  }
  EXPECT_EQ(cp->stats().device.used_blocks, 0);
}

// The same workload with full attention runs out of the same pool: the bound above is the
// window's doing.
TEST_P(WindowMemoryBound, FullAttentionExhaustsTheSamePool) {
  const int64_t w = GetParam().window;
  const int64_t bs = GetParam().block_size;
  const int kSeqs = 6;
  const int kPrompt = 3 * static_cast<int>(w) + 5;
  const int64_t pool = kSeqs * decode_bound(w, bs) + ceil_div(kPrompt, bs) + 1;
  auto cp = make_cp(window_config(static_cast<int32_t>(bs), 0, pool));
  bool exhausted = false;
  for (SequenceId id = 1; id <= kSeqs && !exhausted; ++id) {
    const std::vector<TokenId> prompt = iota_tokens(kPrompt, static_cast<TokenId>(id * 100000));
    ASSERT_OK(cp->add_sequence(id, prompt).status());
    auto r = cp->reserve(id, kPrompt);
    exhausted = !r.ok() || !r->transfers.evicted.empty();
    if (r.ok()) {
      ASSERT_OK(cp->commit(id, prompt));
    }
    PAGEDKV_EXPECT_INV(*cp);
  }
  for (int step = 0; step < 300 && !exhausted; ++step) {
    for (SequenceId id = 1; id <= kSeqs && !exhausted; ++id) {
      if (!cp->contains(id)) continue;
      auto r = cp->reserve(id, 1);
      exhausted = !r.ok() || !r->transfers.evicted.empty();
      const TokenId t = 7;
      if (r.ok()) {
        ASSERT_OK(cp->commit(id, &t, 1));
      }
      PAGEDKV_EXPECT_INV(*cp);
    }
  }
  EXPECT_TRUE(exhausted);
  EXPECT_EQ(cp->stats().window_released_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Windows, WindowMemoryBound,
                         ::testing::Values(BoundCase{64, 16}, BoundCase{40, 8}, BoundCase{16, 16},
                                           BoundCase{24, 16}, BoundCase{8, 8}),
                         [](const ::testing::TestParamInfo<BoundCase>& p) {
                           return "W" + std::to_string(p.param.window) + "_bs" +
                                  std::to_string(p.param.block_size);
                         });

// Batched decode (reserve_batch / commit_batch) trims the same way.
TEST(SlidingWindow, BatchedDecodeTrimsEveryMember) {
  const int64_t w = 40;
  const int64_t bs = 8;
  auto cp = make_cp(window_config(8, 40, 4 * decode_bound(w, bs) + 8));
  const std::vector<SequenceId> ids = {1, 2, 3, 4};
  for (SequenceId id : ids) {
    add_and_fill(*cp, id, iota_tokens(37, static_cast<TokenId>(id * 1000)));
    PAGEDKV_EXPECT_INV(*cp);
  }
  ReserveResult out;
  for (int step = 0; step < 200; ++step) {
    out = ReserveResult{};
    ASSERT_OK(cp->reserve_batch(ids, 1, &out));
    PAGEDKV_EXPECT_INV(*cp);
    ASSERT_EQ(out.slots.size(), ids.size());
    std::vector<TokenId> tokens(ids.size(), static_cast<TokenId>(step));
    ASSERT_OK(cp->commit_batch(ids, tokens.data(), 1));
    PAGEDKV_EXPECT_INV(*cp);
    for (SequenceId id : ids) {
      ASSERT_TRUE(table_shape(*cp, id, w, bs));
      ASSERT_LE(held(*cp, id), decode_bound(w, bs));
    }
  }
  int64_t released_entries = 0;
  for (SequenceId id : ids) released_entries += released(*cp, id);
  EXPECT_EQ(cp->stats().window_released_blocks, released_entries);
  EXPECT_EQ(released_entries, 4 * first_needed(237, w, bs));
}

// ---------------------------------------------------------------- 3. prefix hits

// The hit the brief specifies for prompt `p`, given which of the blocks of `base` are cached:
// candidates are whole-block lengths and len - 1, longest first, at most `cap` (-1: no bound);
// one is usable when every block covering [max(0, c - W), c) is cached.
int64_t model_window_hit(const std::vector<TokenId>& p, const std::vector<TokenId>& base,
                         const std::set<int64_t>& cached, int64_t cap, int64_t w, int64_t bs) {
  const int64_t len = static_cast<int64_t>(p.size());
  // Blocks of p that equal base's blocks (a block is keyed by its whole prefix).
  int64_t same = 0;
  while ((same + 1) * bs <= len && (same + 1) * bs <= static_cast<int64_t>(base.size()) &&
         std::equal(p.begin(), p.begin() + (same + 1) * bs, base.begin())) {
    ++same;
  }
  for (int64_t k = len / bs; k > 0; --k) {
    const int64_t c = std::min(k * bs, len - 1);
    if (c == 0 || (cap >= 0 && c > cap)) continue;
    bool usable = true;
    for (int64_t i = first_needed(c, w, bs); i < ceil_div(c, bs); ++i) {
      usable = usable && i < same && cached.count(i) != 0;
    }
    if (usable) return c;
  }
  return 0;
}

class WindowPrefixHits : public ::testing::Test {
 protected:
  static constexpr int32_t kBs = 8;
  static constexpr int32_t kW = 32;
  static constexpr int64_t kPool = 18;

  void SetUp() override {
    cp_ = make_cp(window_config(kBs, kW, kPool));
    base_ = iota_tokens(100, 1000);
  }

  // Checks cached_prefix against the model for every prefix of base_ (and base_ with another
  // tail), every bound.
  void expect_hits_match_model() {
    for (int len = 1; len <= 100; ++len) {
      for (int variant = 0; variant < 2; ++variant) {
        std::vector<TokenId> p(base_.begin(), base_.begin() + len);
        if (variant == 1) p.insert(p.end(), 5, 7);  // another tail
        for (int64_t cap = -1; cap <= static_cast<int64_t>(p.size()); ++cap) {
          auto got = cp_->cached_prefix(p, 0, cap);
          ASSERT_OK(got);
          ASSERT_EQ(*got, model_window_hit(p, base_, cached_, cap, kW, kBs))
              << "prompt of " << p.size() << " tokens (" << len << " of base), cap " << cap;
        }
      }
    }
  }

  // add_sequence shares exactly what cached_prefix said, with -1 before the window and the
  // cached blocks' pages after it; then finishes the sequence (which changes nothing cached).
  void expect_add_agrees(SequenceId id, const std::vector<TokenId>& p, int64_t cap) {
    auto want = cp_->cached_prefix(p, 0, cap);
    ASSERT_OK(want);
    const ControlStats before = cp_->stats();
    auto got = cp_->add_sequence(id, p, {}, cap);
    ASSERT_OK(got);
    PAGEDKV_EXPECT_INV(*cp_);
    EXPECT_EQ(*got, *want) << "cap " << cap;
    ASSERT_TRUE(table_shape(*cp_, id, kW, kBs));
    const std::vector<BlockLocation> t = table(*cp_, id);
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i].block >= 0) {
        EXPECT_EQ(t[i].block, phys_[static_cast<int64_t>(i)]) << "block " << i;
      }
    }
    EXPECT_EQ(cp_->stats().device.cached_blocks + cp_->stats().device.used_blocks,
              before.device.cached_blocks + before.device.used_blocks);
    ASSERT_OK(cp_->finish(id));
    PAGEDKV_EXPECT_INV(*cp_);
  }

  // Takes `n` device blocks for an unrelated sequence (reserved, never committed), forcing
  // evictions once the free blocks are gone.
  void take_blocks(SequenceId id, int64_t n) {
    ASSERT_OK(cp_->add_sequence(id, iota_tokens(1, 900000 + id)).status());
    auto r = cp_->reserve(id, n * kBs);
    ASSERT_OK(r);
    PAGEDKV_EXPECT_INV(*cp_);
  }

  std::unique_ptr<ControlPlane> cp_;
  std::vector<TokenId> base_;
  std::set<int64_t> cached_;         // blocks of base_ in the cache (the model)
  std::map<int64_t, int32_t> phys_;  // their pages
};

TEST_F(WindowPrefixHits, HitsNeedOnlyTheWindowAndSurviveEvictionBeforeIt) {
  // Sequence 1 computes base_ (100 tokens, 12 full blocks) token by token; its blocks fall out
  // of the window as it goes and are cached; finishing it caches the last ones.
  ASSERT_OK(cp_->add_sequence(1, std::vector<TokenId>(base_.begin(), base_.begin() + 1)).status());
  ASSERT_OK(cp_->reserve(1, 1).status());
  ASSERT_OK(cp_->commit(1, base_.data(), 1));
  for (size_t i = 1; i < base_.size(); ++i) {
    ASSERT_OK(cp_->reserve(1, 1).status());
    const std::vector<BlockLocation> t = table(*cp_, 1);
    for (size_t b = 0; b < t.size(); ++b) {
      if (t[b].block >= 0) phys_[static_cast<int64_t>(b)] = t[b].block;
    }
    ASSERT_OK(cp_->commit(1, &base_[i], 1));
    PAGEDKV_EXPECT_INV(*cp_);
    ASSERT_TRUE(table_shape(*cp_, 1, kW, kBs));
  }
  EXPECT_EQ(cp_->stats().window_released_blocks, first_needed(100, kW, kBs));
  EXPECT_EQ(cp_->stats().device.cached_blocks, first_needed(100, kW, kBs));
  ASSERT_OK(cp_->finish(1));
  PAGEDKV_EXPECT_INV(*cp_);
  // Every full block is cached; the partial 13th is freed.
  EXPECT_EQ(cp_->stats().device.cached_blocks, 12);
  EXPECT_EQ(cp_->stats().device.used_blocks, 0);
  for (int64_t i = 0; i < 12; ++i) cached_.insert(i);
  expect_hits_match_model();

  // A prompt sharing 96 tokens hits all 12 blocks' worth but holds only the window's 4.
  std::vector<TokenId> q(base_.begin(), base_.begin() + 96);
  q.insert(q.end(), 14, 5);
  auto hit = cp_->add_sequence(2, q);
  ASSERT_OK(hit);
  EXPECT_EQ(*hit, 96);
  PAGEDKV_EXPECT_INV(*cp_);
  ASSERT_TRUE(table_shape(*cp_, 2, kW, kBs));
  EXPECT_EQ(held(*cp_, 2), 4);
  EXPECT_EQ(cp_->stats().device.used_blocks, 4);
  ASSERT_OK(cp_->finish(2));
  PAGEDKV_EXPECT_INV(*cp_);

  // LRU order now: 0..7 (released by the window), then 8..11 (released again just now, last
  // first: 11, 10, 9, 8). Touch blocks 1..4 with a hit of 40 tokens (window [8, 40)).
  expect_add_agrees(3, std::vector<TokenId>(base_.begin(), base_.begin() + 41), -1);
  // Order: 0, 5, 6, 7, 11, 10, 9, 8, 4, 3, 2, 1. Free blocks: kPool - 12 = 6; taking 8 evicts
  // blocks 0 and 5 of base_.
  take_blocks(100, 8);
  EXPECT_EQ(cp_->stats().blocks_evicted, 2);
  cached_.erase(0);
  cached_.erase(5);
  // Block 0 went before the window of 96 while the later ones stayed (flat nodes): q still
  // hits 96. A prompt of 60 base tokens hit 56 before; its window now misses block 5, so it
  // falls back to 40 (window [8, 40): blocks 1..4), never to 56 or 48.
  EXPECT_EQ(*cp_->cached_prefix(q, 0), 96);
  EXPECT_EQ(*cp_->cached_prefix(std::vector<TokenId>(base_.begin(), base_.begin() + 60), 0), 40);
  expect_hits_match_model();
  // A bound can make a usable length unusable: q with at most 60 tokens shares 40, with at most
  // 30 nothing (the windows of 24, 16 and 8 tokens need block 0), though 96 is usable.
  EXPECT_EQ(*cp_->cached_prefix(q, 0, 60), 40);
  EXPECT_EQ(*cp_->cached_prefix(q, 0, 30), 0);
  EXPECT_EQ(*cp_->cached_prefix(q, 0, 100), 96);
  expect_add_agrees(4, q, 60);
  expect_add_agrees(5, q, 30);
  expect_add_agrees(6, q, -1);
  expect_add_agrees(7, q, 95);
  expect_add_agrees(8, std::vector<TokenId>(base_.begin(), base_.begin() + 97), -1);
  expect_add_agrees(9, std::vector<TokenId>(base_.begin(), base_.begin() + 96), -1);

  // Those hits touched 1..4 (40 tokens), 8..11 (96), 7..10 (88: the bound 95 rules out 96)
  // and 7..11 (95), leaving the order 6, 4, 3, 2, 1, 11, 10, 9, 8, 7. Evicting two more takes
  // 6 and 4: q's window (8..11) stays; the prompt of 60 base tokens now gets nothing (every
  // window up to 56 tokens needs block 0, 4 or 6).
  ASSERT_OK(cp_->finish(100));
  PAGEDKV_EXPECT_INV(*cp_);
  take_blocks(101, kPool - 10 + 2);
  EXPECT_EQ(cp_->stats().blocks_evicted, 4);
  cached_.erase(6);
  cached_.erase(4);
  EXPECT_EQ(*cp_->cached_prefix(std::vector<TokenId>(base_.begin(), base_.begin() + 60), 0), 0);
  EXPECT_EQ(*cp_->cached_prefix(q, 0), 96);
  expect_hits_match_model();
  // Fill the pool completely: every cached block goes, and every hit is 0.
  ASSERT_OK(cp_->finish(101));
  PAGEDKV_EXPECT_INV(*cp_);
  take_blocks(102, kPool);
  cached_.clear();
  EXPECT_EQ(cp_->stats().device.cached_blocks, 0);
  expect_hits_match_model();
}

// A prompt that is all whole blocks, cached, shares one token less: it holds only the window of
// that length and recomputes the last token into a copy, which then dedupes to the cached block.
TEST(SlidingWindow, FullyCachedPromptCopiesTheLastBlockOnWrite) {
  auto cp = make_cp(window_config(8, 16, 16));
  const std::vector<TokenId> p = iota_tokens(48, 10);
  add_and_fill(*cp, 1, p);
  ASSERT_OK(cp->finish(1));
  PAGEDKV_EXPECT_INV(*cp);
  auto hit = cp->add_sequence(2, p);
  ASSERT_OK(hit);
  EXPECT_EQ(*hit, 47);  // window [31, 47): blocks 3..5
  ASSERT_TRUE(table_shape(*cp, 2, 16, 8));
  EXPECT_EQ(held(*cp, 2), 3);
  auto r = cp->reserve(2, 1);
  ASSERT_OK(r);
  EXPECT_EQ(r->transfers.copies.size(), 1u);
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->commit(2, &p[47], 1));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_TRUE(table_shape(*cp, 2, 16, 8));
  // The recomputed block is the cached one again (same prefix): no duplicate.
  EXPECT_EQ(cp->stats().device.cached_blocks + cp->stats().device.used_blocks, 6);
}

TEST(SlidingWindow, AnyBoundAtOrPastThePromptIsNoBound) {
  // With and without a window: a bound of INT64_MAX (no overflow in the block count) or of the
  // prompt's length answers as no bound; a negative bound other than -1 is refused.
  for (int32_t window : {0, 16}) {
    auto cp = make_cp(window_config(8, window, 16));
    const std::vector<TokenId> p = iota_tokens(48, 10);
    add_and_fill(*cp, 1, p);
    ASSERT_OK(cp->finish(1));
    const auto unbounded = cp->cached_prefix(p, 0, -1);
    ASSERT_OK(unbounded);
    EXPECT_EQ(*unbounded, 47) << "window " << window;
    for (int64_t bound : {int64_t{48}, int64_t{1} << 40, INT64_MAX}) {
      const auto hit = cp->cached_prefix(p, 0, bound);
      ASSERT_OK(hit);
      EXPECT_EQ(*hit, *unbounded) << "window " << window << " bound " << bound;
    }
    EXPECT_EQ(cp->cached_prefix(p, 0, -2).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cp->add_sequence(2, p, {}, -5).status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(cp->contains(2));
    auto added = cp->add_sequence(2, p, {}, INT64_MAX);
    ASSERT_OK(added);
    EXPECT_EQ(*added, 47);
    PAGEDKV_EXPECT_INV(*cp);
  }
}

// ---------------------------------------------------------------- 4. fork, tiers, rollback

TEST(SlidingWindow, ForkSharesOnlyLiveBlocks) {
  const int64_t w = 32;
  const int64_t bs = 8;
  auto cp = make_cp(window_config(8, 32, 64));
  add_and_fill(*cp, 1, iota_tokens(50, 10));
  for (int i = 0; i < 20; ++i) decode_step(*cp, 1, static_cast<TokenId>(500 + i));
  const int64_t used = cp->stats().device.used_blocks;
  EXPECT_EQ(used, held(*cp, 1));
  ASSERT_OK(cp->fork(1, 2));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(table(*cp, 2), table(*cp, 1));
  ASSERT_TRUE(table_shape(*cp, 2, w, bs));
  EXPECT_EQ(cp->stats().device.used_blocks, used);  // shared, nothing new
  // The child's released entries are not references: finishing the parent leaves exactly the
  // child's live blocks used, and the child decodes on (copying its shared last block).
  ASSERT_OK(cp->finish(1));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->stats().device.used_blocks, held(*cp, 2));
  for (int i = 0; i < 30; ++i) {
    decode_step(*cp, 2, static_cast<TokenId>(700 + i));
    ASSERT_TRUE(table_shape(*cp, 2, w, bs));
    ASSERT_LE(held(*cp, 2), decode_bound(w, bs));
  }
  ASSERT_OK(cp->finish(2));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(cp->stats().device.used_blocks, 0);
}

TEST(SlidingWindow, OffloadAndRestoreMoveOnlyLiveBlocks) {
  const int64_t w = 32;
  const int64_t bs = 8;
  auto cp = make_cp(window_config(8, 32, 32, 16));
  add_and_fill(*cp, 1, iota_tokens(50, 10));
  for (int i = 0; i < 20; ++i) decode_step(*cp, 1, static_cast<TokenId>(500 + i));
  const std::vector<BlockLocation> before = table(*cp, 1);
  const int64_t live = held(*cp, 1);
  ASSERT_EQ(live, ceil_div(70, bs) - first_needed(70, w, bs));
  auto off = cp->offload(1);
  ASSERT_OK(off);
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_EQ(static_cast<int64_t>(off->moves.size()), live);
  const std::vector<BlockLocation> on_host = table(*cp, 1);
  ASSERT_EQ(on_host.size(), before.size());
  size_t m = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    if (before[i].block < 0) {
      EXPECT_EQ(on_host[i], before[i]) << "entry " << i;
      continue;
    }
    EXPECT_EQ(on_host[i].tier, Tier::kHost);
    EXPECT_EQ(off->moves[m],
              (BlockMove{Tier::kDevice, before[i].block, Tier::kHost, on_host[i].block}));
    ++m;
  }
  auto res = cp->residency(1);
  ASSERT_OK(res);
  EXPECT_EQ(res->host_blocks, live);
  EXPECT_EQ(res->device_blocks, 0);
  EXPECT_EQ(cp->slot(1, 69).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cp->slot(1, 0).status().code(), StatusCode::kOutOfRange);

  auto back = cp->restore(1);
  ASSERT_OK(back);
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_EQ(static_cast<int64_t>(back->moves.size()), live);
  const std::vector<BlockLocation> after = table(*cp, 1);
  ASSERT_EQ(after.size(), before.size());
  m = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].block < 0, before[i].block < 0) << "entry " << i;
    if (after[i].block < 0) continue;
    EXPECT_EQ(after[i].tier, Tier::kDevice);
    EXPECT_EQ(back->moves[m],
              (BlockMove{Tier::kHost, on_host[i].block, Tier::kDevice, after[i].block}));
    ++m;
  }
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
  EXPECT_EQ(cp->stats().blocks_offloaded, live);
  EXPECT_EQ(cp->stats().blocks_restored, live);
  // It decodes on after the round trip.
  for (int i = 0; i < 20; ++i) decode_step(*cp, 1, static_cast<TokenId>(900 + i));
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
}

TEST(SlidingWindow, RollbackWithinTheWindowOnlyOrToZero) {
  const int64_t w = 32;
  const int64_t bs = 8;
  auto cp = make_cp(window_config(8, 32, 32, 16));
  const std::vector<TokenId> p = iota_tokens(70, 10);
  add_and_fill(*cp, 1, p);
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
  ASSERT_EQ(first_needed(70, w, bs), 4);
  // Lengths from 64 on need blocks 4.. only (floor((64 - 32) / 8) = 4): allowed.
  ASSERT_OK(cp->rollback(1, 66));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(*cp->length(1), 66);
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
  ASSERT_OK(cp->reserve(1, 3).status());
  ASSERT_OK(cp->rollback(1, 64));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(*cp->pending(1), 0);
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
  // 63 needs block 3, which is gone: refused, nothing changed.
  const Snapshot snap = snapshot(*cp, {1});
  for (int64_t to : {63, 40, 1}) {
    const Status st = cp->rollback(1, to);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << to << ": " << st.to_string();
    EXPECT_NE(st.message().find("64"), std::string::npos) << st.message();  // shortest allowed
    EXPECT_EQ(snapshot(*cp, {1}), snap);
    PAGEDKV_EXPECT_INV(*cp);
  }
  // Recompute after a rollback within the window: the window keeps trimming.
  ASSERT_OK(cp->reserve(1, 20).status());
  ASSERT_OK(cp->commit(1, iota_tokens(20, 5000)));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
  // 0 is always allowed and releases everything.
  ASSERT_OK(cp->rollback(1, 0));
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_EQ(*cp->length(1), 0);
  EXPECT_TRUE(table(*cp, 1).empty());
  EXPECT_EQ(cp->stats().device.used_blocks, 0);
  // Recomputing from 0 works: the prompt's blocks were cached, so it could as well be re-added.
  ASSERT_OK(cp->reserve(1, 70).status());
  ASSERT_OK(cp->commit(1, p));
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_TRUE(table_shape(*cp, 1, w, bs));
  // Offloaded, the same rules hold.
  ASSERT_OK(cp->offload(1).status());
  EXPECT_EQ(cp->rollback(1, 10).code(), StatusCode::kFailedPrecondition);
  PAGEDKV_EXPECT_INV(*cp);
  ASSERT_OK(cp->rollback(1, 0));
  PAGEDKV_EXPECT_INV(*cp);
}

// ---------------------------------------------------------------- 5. slot and build_batch

TEST(SlidingWindow, ReleasedPositionsHaveNoSlotAndBatchRowsHoldMinusOne) {
  const int64_t bs = 8;
  auto cp = make_cp(window_config(8, 16, 64));
  add_and_fill(*cp, 1, iota_tokens(40, 10));  // window [24, 40): blocks 3, 4 held
  add_and_fill(*cp, 2, iota_tokens(13, 99));  // short: nothing released yet
  ASSERT_OK(cp->reserve(1, 3).status());
  ASSERT_OK(cp->reserve(2, 1).status());
  PAGEDKV_EXPECT_INV(*cp);
  for (int64_t pos = 0; pos < 24; ++pos) {
    const auto s = cp->slot(1, pos);
    EXPECT_EQ(s.status().code(), StatusCode::kOutOfRange) << "position " << pos;
    if (pos == 0) {
      EXPECT_NE(s.status().message().find("sliding window"), std::string::npos)
          << s.status().message();
    }
  }
  const std::vector<BlockLocation> t1 = table(*cp, 1);
  for (int64_t pos = 24; pos < 43; ++pos) {
    const auto s = cp->slot(1, pos);
    ASSERT_OK(s) << "position " << pos;
    EXPECT_EQ(*s, t1[static_cast<size_t>(pos / bs)].block * bs + pos % bs);
  }
  BatchOptions o;
  o.build_csr = true;
  auto check_batch = [&](const std::vector<SequenceId>& ids) {
    auto md = cp->build_batch(ids, o);
    ASSERT_OK(md);
    const BatchMetadata& m = **md;
    size_t slot = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const std::vector<BlockLocation> t = table(*cp, ids[r]);
      ASSERT_EQ(m.indptr[r + 1] - m.indptr[r], static_cast<int32_t>(t.size()));
      for (size_t i = 0; i < static_cast<size_t>(m.max_blocks); ++i) {
        const int32_t want = i < t.size() ? t[i].block : -1;
        EXPECT_EQ(m.block_tables[r * static_cast<size_t>(m.max_blocks) + i], want)
            << "row " << r << " entry " << i;
        if (i < t.size()) {
          EXPECT_EQ(m.indices[static_cast<size_t>(m.indptr[r]) + i], want)
              << "row " << r << " entry " << i;
        }
      }
      const int64_t len = *cp->length(ids[r]);
      for (int64_t p = len; p < len + *cp->pending(ids[r]); ++p) {
        ASSERT_LT(slot, m.slot_mapping.size());
        EXPECT_EQ(m.slot_mapping[slot++], *cp->slot(ids[r], p));
      }
    }
  };
  check_batch({1, 2});
  const std::vector<BlockLocation> r1 = table(*cp, 1);
  EXPECT_EQ(r1[0].block, -1);
  EXPECT_EQ(r1[2].block, -1);
  EXPECT_GE(r1[3].block, 0);
  // Decode on: the rows built before are updated in place as entries fall out of the window.
  ASSERT_OK(cp->commit(1, iota_tokens(3, 50)));
  ASSERT_OK(cp->commit(2, iota_tokens(1, 60)));
  std::vector<SequenceId> ids = {1, 2};
  for (int step = 0; step < 40; ++step) {
    ReserveResult out;
    ASSERT_OK(cp->reserve_batch(ids, 1, &out));
    PAGEDKV_EXPECT_INV(*cp);
    check_batch(ids);
    if (step == 20) check_batch({2, 1});  // rows swapped, then back
    std::vector<TokenId> tok = {static_cast<TokenId>(step), static_cast<TokenId>(step + 1)};
    ASSERT_OK(cp->commit_batch(ids, tok.data(), 1));
    PAGEDKV_EXPECT_INV(*cp);
  }
  EXPECT_GT(released(*cp, 2), 0);
}

// ---------------------------------------------------------------- 6. bad config

TEST(SlidingWindow, RejectsAWindowShorterThanABlockOrNegative) {
  for (int32_t w : {1, 8, 15, -1, -16}) {
    const CacheConfig c = window_config(16, w, 8);
    auto r = ControlPlane::create(c);
    ASSERT_FALSE(r.ok()) << "window " << w;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("sliding_window"), std::string::npos)
        << r.status().message();
  }
  CacheConfig dense = window_config(16, 32, 8);
  dense.mode = CacheMode::kDense;
  EXPECT_EQ(dense.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dense.validate().message().find("sliding_window"), std::string::npos);
  for (int32_t w : {0, 16, 17, 4096}) {
    EXPECT_OK(ControlPlane::create(window_config(16, w, 8))) << "window " << w;
  }
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
