// ModelKvCache::drain_events: one stream of every group's block events, oldest first, each
// tagged with its group. A two-group model (group 0 full attention, group 1 sliding window 64,
// block size 16): a block's store is announced in the full group, then in the window group;
// window pages released and later evicted are removed with group 1 while group 0 keeps the
// blocks; an overflowed event ring resyncs ahead of the newest events it kept; a one-group model
// drains what a KvCache does.
// Expected hashes come from the reference formula (events/block_hash_reference.hpp), expected
// events from the calls made, never from the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "events/block_hash_reference.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/model_cache.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlock = 16;
constexpr int32_t kWindow = 64;
constexpr int32_t kFull = 0;      // group index of the full-attention layers
constexpr int32_t kWindowed = 1;  // group index of the sliding-window layers

// Layers 0 and 2 full attention (group 0), 1 and 3 sliding window 64 (group 1). The window
// group's pool is 8 blocks: a 128-token prefill fills it, and what it releases is evicted by
// the next sequence.
CacheConfig two_groups() {
  CacheConfig c;
  c.num_layers = 4;
  c.block_size = kBlock;
  c.backend = BackendKind::kCpu;
  KvGroup full;
  full.name = "full";
  full.layers = {0, 2};
  full.num_kv_heads = 1;
  full.head_dim = 8;
  full.num_device_blocks = 64;
  KvGroup window;
  window.name = "window";
  window.layers = {1, 3};
  window.num_kv_heads = 1;
  window.head_dim = 8;
  window.sliding_window = kWindow;
  window.num_device_blocks = 8;
  c.groups = {full, window};
  return c;
}

std::vector<TokenId> tokens(int n, TokenId first, TokenId step) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(first + step * i);
  return t;
}

std::vector<uint64_t> ref_hashes(const std::vector<TokenId>& prompt) {
  return testing::ref_prompt_hashes(prompt, kBlock);
}

// add_sequence, reserve and commit of the whole prompt (nothing cached is expected).
void prefill(ModelKvCache& m, SequenceId id, const std::vector<TokenId>& prompt) {
  auto cached = m.add_sequence(id, prompt);
  ASSERT_OK(cached);
  ASSERT_EQ(*cached, 0);
  auto slots = m.reserve(id, static_cast<int64_t>(prompt.size()));
  ASSERT_OK(slots);
  ASSERT_OK(m.commit(id, prompt));
  ASSERT_OK(m.check_invariants());
}

std::string describe(const ControlEvent& e) {
  return "kind " + std::to_string(static_cast<int>(e.kind)) + " group " + std::to_string(e.group) +
         " hash " + std::to_string(e.block_hash);
}

// `e` is the device-tier store of block `b` of `prompt` in `group`.
void expect_stored(const ControlEvent& e, int32_t group, const std::vector<TokenId>& prompt,
                   size_t b) {
  const std::vector<uint64_t> h = ref_hashes(prompt);
  EXPECT_EQ(e.kind, EventKind::kBlockStored) << describe(e);
  EXPECT_EQ(e.group, group) << describe(e);
  EXPECT_EQ(e.tier, Tier::kDevice);
  EXPECT_EQ(e.block_hash, h[b]) << "block " << b;
  EXPECT_EQ(e.parent_hash, b == 0 ? testing::ref_root_hash(0) : h[b - 1]) << "block " << b;
  EXPECT_EQ(e.tokens,
            std::vector<TokenId>(prompt.begin() + static_cast<std::ptrdiff_t>(b * kBlock),
                                 prompt.begin() + static_cast<std::ptrdiff_t>((b + 1) * kBlock)));
}

const std::vector<TokenId> kPromptA = tokens(128, 1000, 7);  // 8 blocks
const std::vector<TokenId> kPromptB = tokens(64, 50000, 3);  // 4 blocks

TEST(ModelKvCacheEvents, StoresCarryTheirGroupGroupsInOrder) {
  auto m = ModelKvCache::create(two_groups());
  ASSERT_OK(m);
  prefill(**m, 1, kPromptA);
  const std::vector<ControlEvent> ev = (*m)->drain_events();
  // Both groups stored the 8 full blocks, block by block: the full group's, then the window's.
  ASSERT_EQ(ev.size(), 16u);
  for (size_t b = 0; b < 8; ++b) {
    expect_stored(ev[2 * b], kFull, kPromptA, b);
    expect_stored(ev[2 * b + 1], kWindowed, kPromptA, b);
  }
  EXPECT_TRUE((*m)->drain_events().empty());
}

TEST(ModelKvCacheEvents, BlocksTheWindowReleasedAreEvictedWithTheWindowGroup) {
  auto m = ModelKvCache::create(two_groups());
  ASSERT_OK(m);
  prefill(**m, 1, kPromptA);
  ASSERT_EQ((*m)->drain_events().size(), 16u);
  // At 128 tokens the window (64) needs blocks 4..7 only: the pages of blocks 0..3 in the
  // window group are released into its prefix cache, and its pool of 8 has no free page left.
  // Sequence 2's 4 blocks evict exactly those 4 pages there; the full group (64 blocks) evicts
  // nothing.
  prefill(**m, 2, kPromptB);
  const std::vector<ControlEvent> ev = (*m)->drain_events();
  const std::vector<uint64_t> a = ref_hashes(kPromptA);
  ASSERT_EQ(ev.size(), 12u);
  // The removals (during reserve) before the stores (at commit).
  std::set<uint64_t> removed;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ev[i].kind, EventKind::kBlockRemoved) << describe(ev[i]);
    EXPECT_EQ(ev[i].group, kWindowed) << describe(ev[i]);
    EXPECT_EQ(ev[i].tier, Tier::kDevice);
    removed.insert(ev[i].block_hash);
  }
  EXPECT_EQ(removed, std::set<uint64_t>(a.begin(), a.begin() + 4));
  for (size_t b = 0; b < 4; ++b) {
    expect_stored(ev[4 + 2 * b], kFull, kPromptB, b);
    expect_stored(ev[5 + 2 * b], kWindowed, kPromptB, b);
  }
  // The full group still holds every block of A: a prompt of A and one more token hits all 8
  // there.
  for (const ControlEvent& e : ev) {
    EXPECT_FALSE(e.group == kFull && e.kind == EventKind::kBlockRemoved) << describe(e);
  }
  std::vector<TokenId> longer = kPromptA;
  longer.push_back(7);
  auto hit = (*m)->cache().cached_prefix(longer);
  ASSERT_OK(hit);
  EXPECT_EQ(*hit, 128);
}

TEST(ModelKvCacheEvents, AnOverflowedRingResyncsAheadOfTheNewestEvents) {
  ModelKvCacheOptions o;
  o.cache.event_capacity = 6;
  auto m = ModelKvCache::create(two_groups(), o);
  ASSERT_OK(m);
  // 16 stores in a ring of 6: the resync with the 10 lost, then the newest 6 (blocks 5..7 in
  // both groups).
  prefill(**m, 1, kPromptA);
  std::vector<ControlEvent> ev = (*m)->drain_events();
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev[0].kind, EventKind::kEventsDropped);
  EXPECT_EQ(ev[0].dropped_events, 10);
  for (size_t b = 5; b < 8; ++b) {
    expect_stored(ev[1 + 2 * (b - 5)], kFull, kPromptA, b);
    expect_stored(ev[2 + 2 * (b - 5)], kWindowed, kPromptA, b);
  }
  // Sequence 2: 4 window removals and 8 stores; the removals and the first block's two stores
  // are lost.
  prefill(**m, 2, kPromptB);
  ev = (*m)->drain_events();
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev[0].kind, EventKind::kEventsDropped);
  EXPECT_EQ(ev[0].dropped_events, 6);
  for (size_t b = 1; b < 4; ++b) {
    expect_stored(ev[1 + 2 * (b - 1)], kFull, kPromptB, b);
    expect_stored(ev[2 + 2 * (b - 1)], kWindowed, kPromptB, b);
  }
}

TEST(ModelKvCacheEvents, OneGroupDrainsWhatItsKvCacheDrains) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = kBlock;
  c.num_device_blocks = 8;
  c.backend = BackendKind::kCpu;
  auto m = ModelKvCache::create(c);
  ASSERT_OK(m);
  auto kv = KvCache::create(c);
  ASSERT_OK(kv);
  // Two prompts of 8 blocks in a pool of 8: the second evicts the first's cached blocks.
  for (SequenceId id : {SequenceId{1}, SequenceId{2}}) {
    const std::vector<TokenId> p = id == 1 ? kPromptA : tokens(128, 9000, 5);
    prefill(**m, id, p);
    ASSERT_OK((*kv)->add_sequence(id, p));
    ASSERT_OK((*kv)->reserve(id, 128));
    ASSERT_OK((*kv)->commit(id, p));
    ASSERT_OK((*m)->finish(id));
    ASSERT_OK((*kv)->finish(id));
  }
  const std::vector<ControlEvent> got = (*m)->drain_events();
  const std::vector<ControlEvent> want = (*kv)->drain_events();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got.size(), 24u);  // 8 stored, 8 removed, 8 stored
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].group, 0);
    EXPECT_EQ(got[i].kind, want[i].kind) << i;
    EXPECT_EQ(got[i].tier, want[i].tier) << i;
    EXPECT_EQ(got[i].block_hash, want[i].block_hash) << i;
    EXPECT_EQ(got[i].parent_hash, want[i].parent_hash) << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  }
}

}  // namespace
}  // namespace pagedkv
