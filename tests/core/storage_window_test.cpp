// A sliding-window cache's storage reads (storage_lookup, begin_arrival, finish_arrival on flat
// nodes): the lookup names exactly the blocks the window of the longest hit within the bound
// needs and the index lacks, keyed by the hashes the cache gives them when it computes them; a
// lookup that would leave a hole (more blocks than the host can take) names none; arrived blocks
// become flat host-cached blocks that a prompt then hits; a failed read or a block computed
// meanwhile registers nothing; storage_reach() says how far a partial arrival reaches, with and
// without a window. check_invariants() after every step.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "support/status_matchers.hpp"
#include "window_test_util.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

constexpr int32_t kBs = 4;
constexpr int32_t kWindow = 8;

// The hash and prefix hash of each full block of `prompt` as a window cache computing all of it
// stores them (its kBlockStored events), in block order.
struct BlockKeys {
  std::vector<uint64_t> hash;
  std::vector<uint64_t> prefix;
};
BlockKeys computed_keys(const std::vector<TokenId>& prompt) {
  auto cp = make_cp(window_config(kBs, kWindow, 64));
  add_and_fill(*cp, 1, prompt);
  BlockKeys k;
  for (const ControlEvent& e : cp->drain_events()) {
    if (e.kind != EventKind::kBlockStored) continue;
    k.hash.push_back(e.block_hash);
    k.prefix.push_back(e.parent_hash);
  }
  return k;
}

std::vector<TokenId> block_tokens(const std::vector<TokenId>& prompt, std::vector<int> blocks) {
  std::vector<TokenId> t;
  for (int b : blocks) {
    t.insert(t.end(), prompt.begin() + b * kBs, prompt.begin() + (b + 1) * kBs);
  }
  return t;
}

class StorageWindowTest : public ::testing::Test {
 protected:
  // Device 16 blocks, host 8; the prompt is 24 tokens, 6 full blocks. Its longest hit is 23
  // tokens (one left to compute), whose next token attends to [15, 23): blocks 3, 4 and 5.
  void SetUp() override {
    cp_ = make_cp(window_config(kBs, kWindow, 16, 8));
    prompt_ = iota_tokens(24, 700);
    keys_ = computed_keys(prompt_);
    ASSERT_EQ(keys_.hash.size(), 6u);
  }

  StorageLookup lookup(int64_t max_blocks = 16, int64_t max_cached = -1) {
    auto l = cp_->storage_lookup(prompt_, 0, max_blocks, max_cached);
    EXPECT_OK(l);
    return l.ok() ? *l : StorageLookup{};
  }

  // Brings the listed blocks of `l` in through an arrival that succeeds; -1 on an error.
  int64_t arrive(const StorageLookup& l) {
    auto a = cp_->begin_arrival(l, static_cast<int64_t>(l.hashes.size()));
    EXPECT_OK(a);
    EXPECT_OK(cp_->check_invariants());
    if (!a.ok()) return -1;
    auto n = cp_->finish_arrival(a->id, true);
    EXPECT_OK(n);
    EXPECT_OK(cp_->check_invariants());
    return n.ok() ? *n : -1;
  }

  std::unique_ptr<ControlPlane> cp_;
  std::vector<TokenId> prompt_;
  BlockKeys keys_;
};

TEST_F(StorageWindowTest, TheLookupNamesTheWindowsBlocksOfTheLongestHitByTheirComputedKeys) {
  const StorageLookup l = lookup();
  EXPECT_EQ(l.hashes, (std::vector<uint64_t>{keys_.hash[3], keys_.hash[4], keys_.hash[5]}));
  EXPECT_EQ(l.prefix_hashes,
            (std::vector<uint64_t>{keys_.prefix[3], keys_.prefix[4], keys_.prefix[5]}));
  EXPECT_EQ(keys_.prefix[3], keys_.hash[2]) << "a block's prefix hash is its predecessor's hash";
  EXPECT_EQ(l.tokens, block_tokens(prompt_, {3, 4, 5}));
  EXPECT_EQ(l.cached_reach, 0);
  EXPECT_EQ(l.reach, 23);
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(StorageWindowTest, ABoundMovesTheWindowToTheLongestHitWithinIt) {
  // 12 tokens: three blocks, the next token attends to [4, 12): blocks 1 and 2.
  const StorageLookup l = lookup(16, 12);
  EXPECT_EQ(l.hashes, (std::vector<uint64_t>{keys_.hash[1], keys_.hash[2]}));
  EXPECT_EQ(l.tokens, block_tokens(prompt_, {1, 2}));
  EXPECT_EQ(l.reach, 12);
  // 14 tokens is not a hit length (3 blocks give 12, 4 give 16): the same window.
  EXPECT_EQ(lookup(16, 14).hashes, l.hashes);
  EXPECT_EQ(lookup(16, 14).reach, 12);
  EXPECT_TRUE(lookup(16, 3).hashes.empty()) << "no hit of at most 3 tokens";
  EXPECT_EQ(cp_->storage_lookup(prompt_, 0, 16, -2).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(StorageWindowTest, BlocksTheIndexHoldsAreNotListedAgain) {
  // Block 4 alone arrives first (a lookup trimmed to it).
  StorageLookup only4 = lookup();
  only4.hashes = {only4.hashes[1]};
  only4.prefix_hashes = {only4.prefix_hashes[1]};
  only4.tokens = block_tokens(prompt_, {4});
  EXPECT_EQ(arrive(only4), 1);
  const StorageLookup l = lookup();
  EXPECT_EQ(l.hashes, (std::vector<uint64_t>{keys_.hash[3], keys_.hash[5]}));
  EXPECT_EQ(l.tokens, block_tokens(prompt_, {3, 5}));
  EXPECT_EQ(*cp_->cached_prefix(prompt_, 0), 0) << "a window with holes is no hit";
}

TEST_F(StorageWindowTest, ArrivedBlocksAreFlatHostBlocksThatAPromptHits) {
  EXPECT_EQ(arrive(lookup()), 3);
  EXPECT_EQ(cp_->stats().storage_hit_blocks, 3);
  EXPECT_EQ(cp_->stats().host.cached_blocks, 3);
  EXPECT_TRUE(lookup().hashes.empty()) << "nothing left to fetch";
  EXPECT_EQ(lookup().reach, 23);
  EXPECT_EQ(*cp_->cached_prefix(prompt_, 0), 23);
  auto hit = cp_->add_sequence(1, prompt_);
  ASSERT_OK(hit);
  EXPECT_EQ(*hit, 23);
  EXPECT_EQ(cp_->stats().prefix_host_hit_blocks, 2) << "whole blocks: 3 and 4 (5 is partly used)";
  PAGEDKV_EXPECT_INV(*cp_);
  // The blocks before the window are not held; the window's come back to the device.
  ASSERT_OK(cp_->reserve(1, 1));
  EXPECT_TRUE(table_shape(*cp_, 1, kWindow, kBs));
  EXPECT_EQ(held(*cp_, 1), 3);
  PAGEDKV_EXPECT_INV(*cp_);
}

TEST_F(StorageWindowTest, ALookupThatWouldLeaveAHoleNamesNothing) {
  const StorageLookup l = lookup(2);  // three needed, two host slots offered
  EXPECT_TRUE(l.hashes.empty());
  EXPECT_TRUE(l.prefix_hashes.empty());
  EXPECT_TRUE(l.tokens.empty());
  EXPECT_EQ(l.reach, 0);
}

TEST_F(StorageWindowTest, AFailedReadOrABlockComputedMeanwhileRegistersNothing) {
  const StorageLookup l = lookup();
  auto failed = cp_->begin_arrival(l, 3);
  ASSERT_OK(failed);
  EXPECT_EQ(cp_->stats().host.free_blocks, 5) << "the arrival holds three host slots";
  EXPECT_EQ(*cp_->finish_arrival(failed->id, false), 0);
  EXPECT_EQ(cp_->stats().host.free_blocks, 8);
  EXPECT_EQ(cp_->stats().host.cached_blocks, 0);
  PAGEDKV_EXPECT_INV(*cp_);
  // The prompt is computed while a second read is in flight: its blocks arrive as duplicates.
  auto late = cp_->begin_arrival(lookup(), 3);
  ASSERT_OK(late);
  add_and_fill(*cp_, 2, prompt_);
  ASSERT_OK(cp_->finish(2));
  PAGEDKV_EXPECT_INV(*cp_);
  const int64_t cached_before = cp_->stats().device.cached_blocks;
  EXPECT_EQ(*cp_->finish_arrival(late->id, true), 0);
  EXPECT_EQ(cp_->stats().host.cached_blocks, 0);
  EXPECT_EQ(cp_->stats().host.free_blocks, 8);
  EXPECT_EQ(cp_->stats().device.cached_blocks, cached_before);
  PAGEDKV_EXPECT_INV(*cp_);
}

// A listed block whose key is not the hash the cache gives it (a broken caller) is freed, never
// indexed, and named by no event; the other flat blocks stand alone and register.
TEST_F(StorageWindowTest, AFlatBlockWhoseKeyIsNotItsHashIsFreedWithoutAnEvent) {
  StorageLookup l = lookup();
  ASSERT_EQ(l.hashes.size(), 3u);
  l.hashes[1] ^= 1;
  cp_->drain_events();
  EXPECT_EQ(arrive(l), 2);
  std::vector<uint64_t> stored;
  for (const ControlEvent& e : cp_->drain_events()) {
    EXPECT_EQ(e.kind, EventKind::kBlockStored);
    stored.push_back(e.block_hash);
  }
  EXPECT_EQ(stored, (std::vector<uint64_t>{keys_.hash[3], keys_.hash[5]}));
  EXPECT_EQ(cp_->stats().host.cached_blocks, 2);
  EXPECT_EQ(cp_->stats().host.free_blocks, 6);
  EXPECT_EQ(*cp_->cached_prefix(prompt_, 0), 0) << "a window with a hole is no hit";
}

TEST_F(StorageWindowTest, AWindowLookupIsRefusedByAFullAttentionArrivalAndTheOtherWayRound) {
  StorageLookup flat = lookup();
  flat.prefix_hashes.clear();  // not flat any more: not this cache's
  EXPECT_EQ(cp_->begin_arrival(flat, 1).status().code(), StatusCode::kInvalidArgument);
  StorageLookup uneven = lookup();
  uneven.prefix_hashes.pop_back();
  EXPECT_EQ(cp_->begin_arrival(uneven, 1).status().code(), StatusCode::kInvalidArgument);
  auto full = make_cp(tiny_config(kBs, 16, 8));
  EXPECT_EQ(full->begin_arrival(lookup(), 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cp_->stats().host.free_blocks, 8);
  PAGEDKV_EXPECT_INV(*cp_);
  PAGEDKV_EXPECT_INV(*full);
}

// Two of the window's three blocks arrived intact: no hit can use them, so none is kept.
TEST_F(StorageWindowTest, APartlyGoodWindowRegistersNothing) {
  auto a = cp_->begin_arrival(lookup(), 3);
  ASSERT_OK(a);
  EXPECT_EQ(*cp_->finish_arrival_partly(a->id, 2), 0);
  EXPECT_EQ(cp_->stats().host.cached_blocks, 0);
  EXPECT_EQ(cp_->stats().host.free_blocks, 8);
  PAGEDKV_EXPECT_INV(*cp_);
  auto b = cp_->begin_arrival(lookup(), 3);
  ASSERT_OK(b);
  EXPECT_EQ(*cp_->finish_arrival_partly(b->id, 3), 3) << "all three: the window is whole";
  EXPECT_EQ(*cp_->cached_prefix(prompt_, 0), 23);
}

TEST_F(StorageWindowTest, StorageReachCountsOnlyACompleteWindow) {
  const StorageLookup l = lookup();
  EXPECT_EQ(cp_->storage_reach(l, 3), 23);
  EXPECT_EQ(cp_->storage_reach(l, 2), 0) << "blocks 3 and 4 without 5 complete no window";
  EXPECT_EQ(cp_->storage_reach(l, 0), 0);
}

// Full attention: the first 8 tokens cached, the lookup lists blocks 2..5; k blocks in a row
// from the start reach min(4k, 23) tokens.
TEST(StorageReachFullAttention, APartialArrivalReachesAsFarAsItsBlocksRunOn) {
  auto cp = make_cp(tiny_config(kBs, 16, 8));
  const std::vector<TokenId> prompt = iota_tokens(24, 900);
  add_and_fill(*cp, 1, std::vector<TokenId>(prompt.begin(), prompt.begin() + 8));
  ASSERT_OK(cp->finish(1));
  auto l = cp->storage_lookup(prompt, 0, 16);
  ASSERT_OK(l);
  ASSERT_EQ(l->hashes.size(), 4u);
  EXPECT_EQ(l->first_block, 2);
  EXPECT_EQ(l->cached_reach, 8);
  EXPECT_EQ(l->reach, 23);
  const std::map<int64_t, int64_t> want = {{0, 8}, {1, 12}, {2, 16}, {3, 20}, {4, 23}};
  for (const auto& [n, reach] : want) EXPECT_EQ(cp->storage_reach(*l, n), reach) << n;
  // A bound of 13 tokens lists no block past the hit of 12 it allows (16 passes it).
  auto bounded = cp->storage_lookup(prompt, 0, 16, 13);
  ASSERT_OK(bounded);
  EXPECT_EQ(bounded->hashes, std::vector<uint64_t>{l->hashes[0]}) << "block 2 only";
  EXPECT_EQ(bounded->reach, 12);
  PAGEDKV_EXPECT_INV(*cp);
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
