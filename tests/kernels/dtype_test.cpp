// The bit-exact conversions of dtype.hpp against independent expectations: known bit patterns,
// round-to-nearest-even ties, an exhaustive half round trip, and fp8 against a brute-force
// nearest-value search.
#include "pagedkv/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace pagedkv {
namespace {

TEST(DTypeTest, HalfKnownBitPatterns) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);               // rounds past max: infinity
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half_bits(0.1f), 0x2e66);
  const uint16_t nan = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(half_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_bits_to_float(0x8001), -std::ldexp(1.0f, -24));
}

TEST(DTypeTest, HalfRoundsTiesToEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0).
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above the tie rounds up.
  EXPECT_EQ(float_to_half_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Subnormal tie: 1.5 * 2^-24 rounds to 2 * 2^-24 (even), 2.5 * 2^-24 to 2 * 2^-24.
  EXPECT_EQ(float_to_half_bits(1.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_EQ(float_to_half_bits(2.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_EQ(float_to_half_bits(0.5f * std::ldexp(1.0f, -24)), 0x0000);
}

TEST(DTypeTest, HalfRoundTripsAllValuesExhaustively) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_bits_to_float(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(float_to_half_bits(f), h) << "half 0x" << std::hex << h;
    // Independent value check: sign * mantissa * 2^exp.
    const int e = (h >> 10) & 0x1f;
    const int m = h & 0x3ff;
    double want = e == 0 ? std::ldexp(m, -24) : (e == 31 ? INFINITY : std::ldexp(1024 + m, e - 25));
    if (h & 0x8000) want = -want;
    ASSERT_EQ(static_cast<double>(f), want) << h;
  }
}

TEST(DTypeTest, Bf16KnownPatternsAndTies) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-3.0f), 0xc040);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_bits_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16_bits(f), b) << b;
  }
}

TEST(DTypeTest, Fp8E4M3KnownPatterns) {
  EXPECT_EQ(float_to_fp8_e4m3_bits(1.0f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3_bits(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3_bits(1e6f), 0x7e);  // saturates
  EXPECT_EQ(float_to_fp8_e4m3_bits(-1e6f), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3_bits(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3_bits(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_fp8_e4m3_bits(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(fp8_e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_bits_to_float(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_bits_to_float(0x7f)));
}

// Every finite fp8 value, and for many floats the nearest fp8 value found by brute force (ties
// to the even code), must match the conversion.
TEST(DTypeTest, Fp8E4M3MatchesBruteForceNearest) {
  std::vector<double> values;
  for (int b = 0; b < 128; ++b) {
    const int e = (b >> 3) & 0xf, m = b & 7;
    if (e == 15 && m == 7) {
      values.push_back(NAN);
      continue;
    }
    values.push_back(e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
    ASSERT_EQ(static_cast<double>(fp8_e4m3_bits_to_float(static_cast<uint8_t>(b))), values.back())
        << b;
    ASSERT_EQ(float_to_fp8_e4m3_bits(static_cast<float>(values.back())), b);
  }
  auto nearest = [&](double x) {
    int best = 0;
    for (int b = 1; b < 127; ++b) {
      const double db = std::fabs(values[size_t(b)] - x),
                   dbest = std::fabs(values[size_t(best)] - x);
      if (db < dbest || (db == dbest && (b & 1) == 0)) best = b;
    }
    return best;
  };
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(i) * 0.0224f;  // spans 0 .. 448, hits ties and subnormals
    ASSERT_EQ(float_to_fp8_e4m3_bits(x), nearest(x)) << x;
    ASSERT_EQ(float_to_fp8_e4m3_bits(-x), nearest(x) | 0x80) << -x;
  }
  // Exact midpoints between neighbouring codes.
  for (int b = 0; b < 125; ++b) {
    const float mid = static_cast<float>((values[size_t(b)] + values[size_t(b + 1)]) / 2);
    ASSERT_EQ(float_to_fp8_e4m3_bits(mid), (b & 1) ? b + 1 : b) << mid;
  }
}

}  // namespace
}  // namespace pagedkv
