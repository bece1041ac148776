// Helpers shared by the sliding-window tests (sliding_window_test.cpp,
// sliding_window_random_test.cpp): the window's arithmetic as the configuration documents it,
// and checks of a sequence's block table against it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace testing_util {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The first block a sequence of `length` committed tokens still holds (the brief's semantics).
inline int64_t first_needed(int64_t length, int64_t window, int64_t bs) {
  return window == 0 ? 0 : std::max<int64_t>(0, length - window) / bs;
}

// The most blocks a decoding sequence (at most one token reserved) may hold.
inline int64_t decode_bound(int64_t window, int64_t bs) { return ceil_div(window, bs) + 1; }

inline CacheConfig window_config(int32_t block_size, int32_t window, int64_t device,
                                 int64_t host = 0) {
  CacheConfig c = tiny_config(block_size, device, host);
  c.sliding_window = window;
  return c;
}

inline std::vector<BlockLocation> table(const ControlPlane& cp, SequenceId id) {
  auto locs = cp.block_locations(id);
  EXPECT_OK(locs);
  return locs.ok() ? *locs : std::vector<BlockLocation>{};
}

inline int64_t held(const ControlPlane& cp, SequenceId id) {
  int64_t n = 0;
  for (const BlockLocation& l : table(cp, id)) n += l.block >= 0 ? 1 : 0;
  return n;
}

inline int64_t released(const ControlPlane& cp, SequenceId id) {
  int64_t n = 0;
  for (const BlockLocation& l : table(cp, id)) n += l.block < 0 ? 1 : 0;
  return n;
}

// The table of a sequence is [-1 x first_needed(length), held blocks...] covering length +
// pending, and released entries are reported on the device tier.
inline ::testing::AssertionResult table_shape(const ControlPlane& cp, SequenceId id, int64_t window,
                                              int64_t bs) {
  const int64_t len = *cp.length(id);
  const int64_t pend = *cp.pending(id);
  const std::vector<BlockLocation> t = table(cp, id);
  const int64_t first = first_needed(len, window, bs);
  if (static_cast<int64_t>(t.size()) != ceil_div(len + pend, bs)) {
    return ::testing::AssertionFailure() << "sequence " << id << " has " << t.size()
                                         << " entries for " << len << "+" << pend << " tokens";
  }
  for (int64_t i = 0; i < static_cast<int64_t>(t.size()); ++i) {
    const BlockLocation& l = t[static_cast<size_t>(i)];
    if (i < first && !(l.block == -1 && l.tier == Tier::kDevice)) {
      return ::testing::AssertionFailure()
             << "sequence " << id << " (length " << len << ") still holds block " << i
             << " before its window (first needed " << first << ")";
    }
    if (i >= first && l.block < 0) {
      return ::testing::AssertionFailure() << "sequence " << id << " (length " << len
                                           << ") released block " << i << " inside its window";
    }
  }
  return ::testing::AssertionSuccess();
}

// One decode step: reserve one slot, commit one token.
inline void decode_step(ControlPlane& cp, SequenceId id, TokenId token) {
  auto r = cp.reserve(id, 1);
  ASSERT_OK(r) << "sequence " << id;
  PAGEDKV_EXPECT_INV(cp);
  ASSERT_OK(cp.commit(id, &token, 1));
  PAGEDKV_EXPECT_INV(cp);
}
}  // namespace testing_util
}  // namespace core
}  // namespace pagedkv
