// The bounded control-event ring through the runtime: KvCacheOptions::event_capacity reaches the
// control plane (0 rejected, overflow announced by one kEventsDropped event), and a SeedKvCache
// whose user never drains events stays bounded on a long run.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/seed_cache.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

CacheConfig tiny_config(int32_t block_size, int64_t device_blocks) {
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = block_size;
  c.num_device_blocks = device_blocks;
  c.num_host_blocks = 0;
  c.max_sequence_length = 64;
  c.dtype = DType::kFloat16;
  c.backend = BackendKind::kCpu;
  return c;
}

TEST(KvCacheEvents, ZeroEventCapacityIsInvalidArgument) {
  auto backend = create_cpu_backend();
  KvCacheOptions o;
  o.backend = backend.get();
  o.event_capacity = 0;
  EXPECT_EQ(KvCache::create(tiny_config(4, 16), o).status().code(), StatusCode::kInvalidArgument);
}

TEST(KvCacheEvents, SmallCapacityDropsOldestAndAnnouncesIt) {
  auto backend = create_cpu_backend();
  KvCacheOptions o;
  o.backend = backend.get();
  o.event_capacity = 8;
  auto created = KvCache::create(tiny_config(4, 16), o);
  ASSERT_OK(created);
  std::unique_ptr<KvCache> cache = std::move(created).value();
  std::vector<TokenId> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 100);
  ASSERT_OK(cache->add_sequence(1, {}));
  ASSERT_OK(cache->reserve(1, 40));
  ASSERT_OK(cache->commit(1, tokens));  // ten full blocks: ten stored events
  EXPECT_EQ(cache->stats().events_dropped, 2);
  const std::vector<ControlEvent> events = cache->drain_events();
  ASSERT_EQ(events.size(), 9u);
  EXPECT_EQ(events[0].kind, EventKind::kEventsDropped);
  EXPECT_EQ(events[0].dropped_events, 2);
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].kind, EventKind::kBlockStored);
    // The oldest two (blocks 0 and 1) went; block 2 is the first left.
    EXPECT_EQ(events[i].tokens.front(), 100 + 4 * static_cast<TokenId>(i + 1));
  }
  EXPECT_TRUE(cache->drain_events().empty());
}

// block_size 1 and a small pool: every token stores a block and, later, evicts one, so a run of
// 80,000 tokens records about 160,000 events, well past the default capacity of 65,536.
TEST(SeedKvCacheEvents, LongUndrainedRunStaysBounded) {
  const CacheConfig config = [] {
    CacheConfig c = tiny_config(1, 96);
    c.mode = CacheMode::kPaged;
    return c;
  }();
  auto backend = create_cpu_backend();
  SeedKvCacheOptions o;
  o.backend = backend.get();
  auto created = SeedKvCache::create(config, o);
  ASSERT_OK(created);
  std::unique_ptr<SeedKvCache> cache = std::move(created).value();
  ASSERT_NE(cache->paged_cache(), nullptr);

  constexpr int64_t kChunk = 32;
  constexpr int kSequences = 2500;
  std::mt19937 rng(11);
  std::vector<uint16_t> k(kChunk * config.head_dim), v(k.size());
  for (int s = 0; s < kSequences; ++s) {
    for (auto* part : {&k, &v})
      for (uint16_t& x : *part) x = float_to_half_bits(0.5f + static_cast<float>(rng() % 64));
    const SequenceId id = static_cast<SequenceId>(s);
    ASSERT_OK(cache->allocate_sequence(id, {}));
    const Status w = cache->append_head_range_seq_first(id, 0, 0, 0, k, v);
    ASSERT_OK(w);
    ASSERT_OK(cache->advance_sequence_by(id, kChunk));
    ASSERT_OK(cache->remove_sequence(id));
    ASSERT_TRUE(cache->drain_evicted_sequences().empty());
  }
  ASSERT_OK(cache->synchronize());

  KvCache& paged = *cache->paged_cache();
  const ControlStats st = paged.stats();
  const size_t capacity = KvCacheOptions{}.event_capacity;
  EXPECT_GT(st.blocks_evicted, 0);
  EXPECT_GT(st.events_dropped, 0) << "the run never filled the event ring";
  const std::vector<ControlEvent> events = paged.drain_events();
  EXPECT_EQ(events.size(), capacity + 1) << "a full ring plus the marker";
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, EventKind::kEventsDropped);
  EXPECT_EQ(events[0].dropped_events, st.events_dropped);
  EXPECT_TRUE(paged.drain_events().empty());
  EXPECT_OK(paged.check_invariants());
}

}  // namespace
}  // namespace pagedkv
