// Control-plane call sequences that tests/fuzz/kv_cache_fuzz.cpp found breaking the contract,
// kept as plain tests. Each input that found one is also in tests/fuzz/corpus/kv_cache/.
#include <gtest/gtest.h>

#include <cstdint>

#include "core_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace core {
namespace {

using namespace testing_util;  // NOLINT

// Fuzz input crash-reserve-length-overflow: reserve(id, INT64_MAX) on a sequence with tokens
// computed length + n (signed overflow, UBSan) in the max_sequence_length check.
TEST(ControlPlaneFuzzRegression, ReserveOfHugeCountIsOutOfRangeAndChangesNothing) {
  CacheConfig c = tiny_config(4, 6, 2);
  c.max_sequence_length = 20;
  auto cp = make_cp(c);
  add_and_fill(*cp, 1, iota_tokens(6, 0));
  const std::vector<SequenceId> ids{1};
  const Snapshot before = snapshot(*cp, ids);
  for (int64_t n : {INT64_MAX, INT64_MAX - 5, int64_t{15}}) {
    EXPECT_EQ(cp->reserve(1, n).status().code(), StatusCode::kOutOfRange) << n;
    ReserveResult r;
    EXPECT_EQ(cp->reserve_batch({1}, n, &r).code(), StatusCode::kOutOfRange) << n;
  }
  EXPECT_EQ(snapshot(*cp, ids), before);
  PAGEDKV_EXPECT_INV(*cp);
  EXPECT_OK(cp->reserve(1, 14));  // exactly up to the limit still fits
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
