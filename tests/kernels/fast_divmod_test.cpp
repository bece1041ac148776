// FastDivmod (kernels/fast_divmod.hpp) against the `/` and `%` operators: edge divisors (1, 2,
// powers of two and their neighbours, 2^63), random divisors of every magnitude, and dividends
// at the edges of each quotient step, at the top of the range and at random.
#include "kernels/fast_divmod.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace pagedkv::kernels {
namespace {

std::vector<uint64_t> edge_divisors() {
  std::vector<uint64_t> d = {1,
                             2,
                             3,
                             5,
                             6,
                             7,
                             9,
                             10,
                             16,
                             17,
                             24,
                             48,
                             64,
                             80,
                             96,
                             100,
                             127,
                             128,
                             129,
                             255,
                             1000,
                             4093,
                             65535,
                             65536,
                             65537,
                             0x7fffffffu,
                             0x80000000u,
                             0xffffffffu,
                             0x100000000ull,
                             0x100000001ull};
  for (int k = 1; k <= 63; ++k) {
    const uint64_t p = uint64_t{1} << k;
    d.push_back(p - 1);
    d.push_back(p);
    if (k < 63) d.push_back(p + 1);
  }
  return d;
}

// Dividends near 0, near multiples of d, near 2^32, 2^63 and 2^64, and random ones.
std::vector<uint64_t> dividends(uint64_t d, std::mt19937_64& rng) {
  std::vector<uint64_t> n = {0,
                             1,
                             2,
                             d - 1,
                             d,
                             d + 1,
                             2 * d - 1,
                             2 * d,
                             0xffffffffull,
                             0x100000000ull,
                             (uint64_t{1} << 63) - 1,
                             uint64_t{1} << 63,
                             ~uint64_t{0},
                             ~uint64_t{0} - 1,
                             ~uint64_t{0} - d};
  const uint64_t max_q = ~uint64_t{0} / d;
  for (int i = 0; i < 40; ++i) {
    const uint64_t q = rng() % (max_q + (max_q < ~uint64_t{0} ? 1 : 0));
    const uint64_t base = q * d;
    n.push_back(base);
    if (base > 0) n.push_back(base - 1);
    n.push_back(base + (d > 1 ? rng() % d : 0));
    n.push_back(rng());
    n.push_back(rng() >> (rng() % 64));
  }
  return n;
}

::testing::AssertionResult matches(const FastDivmod& f, uint64_t n) {
  const uint64_t want = n / f.divisor;
  const uint64_t got = f.udiv(n);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << n << " / " << f.divisor << ": want " << want << " got " << got;
}

TEST(FastDivmod, EdgeDivisorsMatchTheDivisionOperator) {
  std::mt19937_64 rng(1);
  int64_t checked = 0;
  for (uint64_t d : edge_divisors()) {
    const FastDivmod f = FastDivmod::make(d);
    for (uint64_t n : dividends(d, rng)) {
      ASSERT_TRUE(matches(f, n));
      ++checked;
    }
  }
  EXPECT_GT(checked, 20000);
}

TEST(FastDivmod, RandomDivisorsOfEveryMagnitudeMatchTheDivisionOperator) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 4000; ++i) {
    const int bits = 1 + static_cast<int>(rng() % 63);  // divisors in [1, 2^63)
    uint64_t d = rng() >> (64 - bits);
    if (d == 0) d = 1;
    const FastDivmod f = FastDivmod::make(d);
    for (uint64_t n : dividends(d, rng)) ASSERT_TRUE(matches(f, n));
  }
}

TEST(FastDivmod, SignedDivmodMatchesQuotientAndRemainder) {
  std::mt19937_64 rng(3);
  for (int64_t d : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{80}, int64_t{4096},
                    int64_t{1} << 40, INT64_MAX}) {
    const FastDivmod f = FastDivmod::make(static_cast<uint64_t>(d));
    for (int i = 0; i < 2000; ++i) {
      const int64_t n = static_cast<int64_t>(rng() >> (1 + rng() % 63));
      int64_t q = -1, r = -1;
      f.divmod(n, q, r);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(r, n % d) << n << " % " << d;
      ASSERT_EQ(f.div(n), n / d);
    }
    int64_t q = -1, r = -1;
    f.divmod(INT64_MAX, q, r);
    EXPECT_EQ(q, INT64_MAX / d);
    EXPECT_EQ(r, INT64_MAX % d);
  }
}

}  // namespace
}  // namespace pagedkv::kernels
