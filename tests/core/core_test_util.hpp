// Helpers shared by the control-plane tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "core/control_plane.hpp"
#include "pagedkv/stats_fields.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace testing_util {

// The control plane's invariants hold (check_invariants() is OK); fatal otherwise.
#define PAGEDKV_EXPECT_INV(cp) ASSERT_OK((cp).check_invariants())

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
  EXPECT_OK(r);
  return std::move(r).value();
}

/// Runs `op` on two planes driven alike (a per-id path against a batched one); both calls must
/// answer with the same status code.
template <typename Op>
void expect_same_code(ControlPlane& a, ControlPlane& b, Op&& op) {
  const Status x = op(a);
  const Status y = op(b);
  ASSERT_EQ(x.code(), y.code()) << x.to_string() << " / " << y.to_string();
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
  EXPECT_OK(locs);
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
  EXPECT_OK(cached);
  if (!cached.ok()) return -1;
  const int64_t rest = static_cast<int64_t>(prompt.size()) - *cached;
  auto r = cp.reserve(id, rest);
  EXPECT_OK(r);
  const Status s = cp.commit(id, prompt.data() + *cached, rest);
  EXPECT_OK(s);
  return *cached;
}

/// Everything observable about the listed sequences plus every field of the stats (ControlStats's
/// operator==, generated from PAGEDKV_CONTROL_STATS_FIELDS), for before/after checks.
struct Snapshot {
  ControlStats stats;
  std::vector<int64_t> numbers;  // per listed id: contained, then length and pending if it is
  std::vector<std::vector<BlockLocation>> tables;
  bool operator==(const Snapshot& o) const {
    return stats == o.stats && numbers == o.numbers && tables == o.tables;
  }
};

/// gtest prints a failed comparison with every count by name.
inline void PrintTo(const Snapshot& s, std::ostream* os) {
  for_each_stat(s.stats,
                [os](const std::string& name, int64_t v) { *os << name << "=" << v << " "; });
  *os << "| numbers";
  for (int64_t n : s.numbers) *os << " " << n;
  *os << " | tables";
  for (const auto& t : s.tables) {
    *os << " [";
    for (const BlockLocation& b : t) *os << (b.tier == Tier::kDevice ? " d" : " h") << b.block;
    *os << " ]";
  }
}

inline Snapshot snapshot(const ControlPlane& cp, const std::vector<SequenceId>& ids) {
  Snapshot s;
  s.stats = cp.stats();
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
