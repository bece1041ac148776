// The stats field lists (PAGEDKV_TIER_STATS_FIELDS, PAGEDKV_CONTROL_STATS_FIELDS) cover every
// field of TierStats and ControlStats, and what is generated from them (operator==, for_each_stat,
// stat_values, the tests' named_stats and stats_diff) sees each field: a counter missing from a
// list would make a "changed nothing" check blind to it.
#include "pagedkv/stats_fields.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "pagedkv/control_types.hpp"
#include "support/named_stats.hpp"

namespace pagedkv {
namespace {

// Independent of the lists: every byte of the structs is an int64_t count, so the number of
// counts for_each_stat visits must fill them exactly.
static_assert(sizeof(TierStats) == kNumTierStats * sizeof(int64_t), "TierStats has unlisted bytes");
static_assert(sizeof(ControlStats) == kNumStats * sizeof(int64_t),
              "ControlStats has unlisted bytes");

// The struct's memory as int64_t words (both structs hold only int64_t counts).
std::vector<int64_t> words(const ControlStats& s) {
  std::vector<int64_t> out(sizeof(ControlStats) / sizeof(int64_t));
  std::memcpy(out.data(), &s, sizeof(ControlStats));
  return out;
}

// Sets count i (in for_each_stat order) of `s` to `value`; returns its name.
std::string set_count(ControlStats& s, size_t i, int64_t value) {
  size_t k = 0;
  std::string name;
  for_each_stat(s, [&](const std::string& n, int64_t& v) {
    if (k++ == i) {
      v = value;
      name = n;
    }
  });
  return name;
}

TEST(StatsFields, ForEachStatReachesEveryWordOfTheStruct) {
  ControlStats s;
  int64_t next = 1;
  for_each_stat(s, [&next](const std::string&, int64_t& v) { v = next++; });
  ASSERT_EQ(next - 1, static_cast<int64_t>(kNumStats));
  const std::vector<int64_t> w = words(s);
  ASSERT_EQ(w.size(), kNumStats);
  // Declaration order: word i holds value i + 1, so no word was skipped or visited twice.
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], static_cast<int64_t>(i) + 1) << i;
}

TEST(StatsFields, OperatorEqualsSeesEachCountAlone) {
  const ControlStats zero;
  for (size_t i = 0; i < kNumStats; ++i) {
    ControlStats s;
    const std::string name = set_count(s, i, 7);
    EXPECT_FALSE(s == zero) << name;
    EXPECT_TRUE(s != zero) << name;
    EXPECT_TRUE(s == s) << name;
    // Exactly one word of the struct differs from the default.
    const std::vector<int64_t> w = words(s);
    int changed = 0;
    for (int64_t x : w) changed += x != 0 ? 1 : 0;
    EXPECT_EQ(changed, 1) << name;
    // stat_values sees it at its own index only.
    const auto values = stat_values(s);
    for (size_t j = 0; j < kNumStats; ++j) EXPECT_EQ(values[j], j == i ? 7 : 0) << name;
  }
}

TEST(StatsFields, TierStatsEqualitySeesEachField) {
  for (size_t i = 0; i < kNumStats; ++i) {
    ControlStats s;
    const std::string name = set_count(s, i, -3);
    const bool device = name.rfind("device.", 0) == 0;
    const bool host = name.rfind("host.", 0) == 0;
    EXPECT_EQ(s.device == TierStats{}, !device) << name;
    EXPECT_EQ(s.device != TierStats{}, device) << name;
    EXPECT_EQ(s.host == TierStats{}, !host) << name;
  }
}

TEST(StatsFields, NamesAreUniqueDottedForTiersAndDocumented) {
  std::set<std::string> names;
  size_t device = 0, host = 0;
  for (const StatInfo& info : stat_infos()) {
    EXPECT_TRUE(names.insert(info.name).second) << "duplicate " << info.name;
    ASSERT_NE(info.doc, nullptr);
    EXPECT_GT(std::strlen(info.doc), 5u) << info.name;
    device += info.name.rfind("device.", 0) == 0 ? 1 : 0;
    host += info.name.rfind("host.", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(device, kNumTierStats);
  EXPECT_EQ(host, kNumTierStats);
  // The counters the hand-written lists used to miss (code review, finding 4).
  for (const char* n :
       {"device.total_bytes", "host.used_bytes", "prefix_miss_blocks", "prefix_query_tokens",
        "prefix_hit_tokens", "prefix_host_hit_blocks", "blocks_restored", "blocks_demoted",
        "host_blocks_dropped", "events_dropped"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
}

TEST(StatsFields, ForEachStatNamesMatchTheFields) {
  ControlStats s;
  s.device.free_blocks = 11;
  s.host.used_bytes = 12;
  s.blocks_demoted = 13;
  s.events_dropped = 14;
  testing::NamedStats seen;
  for_each_stat(s, [&seen](const std::string& name, int64_t v, const char* doc) {
    EXPECT_NE(doc, nullptr);
    seen[name] = v;
  });
  EXPECT_EQ(seen.size(), kNumStats);
  EXPECT_EQ(seen.at("device.free_blocks"), 11);
  EXPECT_EQ(seen.at("host.used_bytes"), 12);
  EXPECT_EQ(seen.at("blocks_demoted"), 13);
  EXPECT_EQ(seen.at("events_dropped"), 14);
  EXPECT_EQ(seen.at("host.free_blocks"), 0);
}

// tests/support/named_stats.hpp, used by the runtime tests' "changed nothing" checks.
TEST(StatsFields, NamedStatsAndStatsDiffReportEachChangedCount) {
  const ControlStats zero;
  EXPECT_EQ(testing::stats_diff(zero, zero), "");
  EXPECT_EQ(testing::stats_diff(testing::named_stats(zero), testing::named_stats(zero)), "");
  for (size_t i = 0; i < kNumStats; ++i) {
    ControlStats s;
    const std::string name = set_count(s, i, 5);
    const testing::NamedStats named = testing::named_stats(s);
    ASSERT_EQ(named.size(), kNumStats);
    EXPECT_EQ(named.at(name), 5);
    EXPECT_EQ(testing::stats_diff(testing::named_stats(zero), named), name + " 0->5; ");
    EXPECT_EQ(testing::stats_diff(zero, s), name + " 0->5; ");
  }
}

}  // namespace
}  // namespace pagedkv
