// Helpers shared by the control-plane tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {
namespace testing_util {

#define PAGEDKV_ASSERT_OK(expr)                              \
  do {                                                       \
    const ::pagedkv::Status s_ = (expr);                     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.to_string(); \
  } while (0)

#define PAGEDKV_EXPECT_INV(cp)                              \
  do {                                                      \
    const ::pagedkv::Status inv_ = (cp).check_invariants(); \
    ASSERT_TRUE(inv_.ok()) << inv_.to_string();             \
  } while (0)

/// A paged config with tiny pools.
inline CacheConfig tiny_config(int32_t block_size, int64_t device, int64_t host = 0,
                               EvictionPolicy policy = EvictionPolicy::kLru) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = block_size;
  c.num_device_blocks = device;
  c.num_host_blocks = host;
  c.eviction_policy = policy;
  c.max_sequence_length = 4096;
  return c;
}

/// Fake nanosecond clock for expiry tests.
struct FakeClock {
  std::shared_ptr<int64_t> now = std::make_shared<int64_t>(1000);
  Clock clock() const {
    auto p = now;
    return [p] { return *p; };
  }
};

inline std::unique_ptr<ControlPlane> make_cp(const CacheConfig& c, Clock clock = {}) {
  ControlOptions o;
  o.clock = std::move(clock);
  auto r = ControlPlane::create(c, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

/// Token ids [start, start + n).
inline std::vector<TokenId> iota_tokens(int n, TokenId start) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

/// Device block ids of a sequence (fails the test on a host block).
inline std::vector<int32_t> device_blocks(const ControlPlane& cp, SequenceId id) {
  std::vector<int32_t> out;
  auto locs = cp.block_locations(id);
  EXPECT_TRUE(locs.ok());
  if (!locs.ok()) return out;
  for (const BlockLocation& l : *locs) {
    EXPECT_EQ(l.tier, Tier::kDevice);
    out.push_back(l.block);
  }
  return out;
}

/// Adds a sequence and computes its whole prompt: reserve + commit of the uncached part.
inline int64_t add_and_fill(ControlPlane& cp, SequenceId id, const std::vector<TokenId>& prompt,
                            const SequenceOptions& o = {}) {
  auto cached = cp.add_sequence(id, prompt, o);
  EXPECT_TRUE(cached.ok()) << cached.status().to_string();
  if (!cached.ok()) return -1;
  const int64_t rest = static_cast<int64_t>(prompt.size()) - *cached;
  auto r = cp.reserve(id, rest);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  const Status s = cp.commit(id, prompt.data() + *cached, rest);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return *cached;
}

/// Everything observable about the listed sequences plus the stats, for before/after checks.
struct Snapshot {
  std::vector<int64_t> numbers;
  std::vector<std::vector<BlockLocation>> tables;
  bool operator==(const Snapshot& o) const { return numbers == o.numbers && tables == o.tables; }
};

inline Snapshot snapshot(const ControlPlane& cp, const std::vector<SequenceId>& ids) {
  Snapshot s;
  const ControlStats st = cp.stats();
  for (const TierStats* t : {&st.device, &st.host}) {
    s.numbers.insert(s.numbers.end(), {t->total_blocks, t->free_blocks, t->cached_blocks,
                                       t->used_blocks, t->used_bytes});
  }
  s.numbers.insert(s.numbers.end(), {st.sequences, st.active_sequences, st.offloaded_sequences,
                                     st.prefix_queries, st.prefix_hit_blocks, st.blocks_evicted,
                                     st.sequences_evicted, st.sequences_offloaded,
                                     st.blocks_offloaded, st.sequences_restored, st.copy_on_write});
  for (SequenceId id : ids) {
    s.numbers.push_back(cp.contains(id) ? 1 : 0);
    if (!cp.contains(id)) continue;
    s.numbers.push_back(*cp.length(id));
    s.numbers.push_back(*cp.pending(id));
    s.tables.push_back(*cp.block_locations(id));
  }
  return s;
}

}  // namespace testing_util
}  // namespace core
}  // namespace pagedkv
