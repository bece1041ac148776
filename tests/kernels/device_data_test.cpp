// The test-data utility (tools/test_data/device_data.hpp) on both backends: its fills equal the
// host functions they name, its mismatch and checksum equal plain host loops, at odd sizes and
// offsets, and its calls order behind the stream's queued work.
#include "device_data.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kv_model_value.hpp"
#include "support/backend_test.hpp"

namespace pagedkv::testing {
namespace {

template <typename Tag>
class DeviceDataTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(DeviceDataTest, AllBackends, BackendName);

/// The checksum's definition, byte by byte.
uint64_t host_checksum(const uint8_t* p, size_t bytes) {
  uint64_t sum = 0;
  for (size_t w = 0; w * 8 < bytes; ++w) {
    uint64_t word = 0;
    for (size_t k = 0; k < 8 && w * 8 + k < bytes; ++k) word |= uint64_t{p[w * 8 + k]} << (8 * k);
    sum += checksum_term(w, word);
  }
  return sum;
}

TYPED_TEST(DeviceDataTest, APatternFillHoldsPatternValueInEveryDType) {
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n));
      DeviceBuffer buf(this->backend(), static_cast<size_t>(n) * dtype_size(t));
      ASSERT_OK(fill_pattern(this->backend(), Stream{}, buf.data(), n, t, 42));
      const std::vector<uint8_t> got = buf.download<uint8_t>();
      std::vector<uint8_t> want(got.size());
      for (int64_t i = 0; i < n; ++i) {
        const float x = pattern_value(42, i);
        EXPECT_GE(std::abs(x), 0.0625f);
        EXPECT_LT(std::abs(x), 2.05f);
        store_from_float(want.data(), t, i, x);
      }
      EXPECT_EQ(want, got);
    }
  }
  // Another seed, other values.
  EXPECT_NE(pattern_value(1, 5), pattern_value(2, 5));
}

TYPED_TEST(DeviceDataTest, ModelRowsHoldTheKvModelOfEachRowsTokenAndPosition) {
  const std::vector<int64_t> positions = {0, 3, 17, 1000, 5};
  const std::vector<TokenId> tokens = {0, 11, 2, 99999, 7};
  const int32_t heads = 3, dim = 7;
  DeviceBuffer dpos(this->backend(), positions.size() * sizeof(int64_t));
  DeviceBuffer dtok(this->backend(), tokens.size() * sizeof(TokenId));
  dpos.upload(positions);
  dtok.upload(tokens);
  DeviceBuffer out(this->backend(), positions.size() * heads * dim * sizeof(uint16_t));
  ModelRows rows;
  rows.positions = static_cast<const int64_t*>(dpos.data());
  rows.tokens = static_cast<const TokenId*>(dtok.data());
  rows.rows = static_cast<int64_t>(positions.size());
  rows.layer = 2;
  rows.part = 1;
  rows.heads = heads;
  rows.head_dim = dim;
  ASSERT_OK(fill_model_rows(this->backend(), Stream{}, static_cast<uint16_t*>(out.data()), rows));
  const std::vector<uint16_t> got = out.download<uint16_t>();
  size_t i = 0;
  for (size_t r = 0; r < positions.size(); ++r) {
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t d = 0; d < dim; ++d, ++i) {
        ASSERT_EQ(got[i], kv_model_bits(positions[r], tokens[r], 2, 1, h, d))
            << "row " << r << " head " << h << " dim " << d;
      }
    }
  }
  // The model's origin is 0.25, whose fp16 bits are 0x3400.
  EXPECT_EQ(kv_model_bits(0, 0, 0, 0, 0, 0), 0x3400);
}

TYPED_TEST(DeviceDataTest, FirstMismatchNamesTheFirstDifferingByteOrNone) {
  const size_t n = 1003;
  std::vector<uint8_t> a(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint8_t>(i * 7 + 1);
  DeviceBuffer da(this->backend(), n), db(this->backend(), n);
  da.upload(a);
  for (size_t at : {size_t{0}, size_t{517}, n - 1}) {
    SCOPED_TRACE("difference at " + std::to_string(at));
    std::vector<uint8_t> b = a;
    db.upload(b);
    auto same = first_mismatch(this->backend(), Stream{}, da.data(), db.data(), n);
    ASSERT_OK(same);
    EXPECT_FALSE(same->has_value());
    b[at] ^= 0x40;
    if (at + 300 < n) b[at + 300] ^= 0x01;  // a later difference is not the first
    db.upload(b);
    auto diff = first_mismatch(this->backend(), Stream{}, da.data(), db.data(), n);
    ASSERT_OK(diff);
    ASSERT_TRUE(diff->has_value());
    EXPECT_EQ((*diff)->index, static_cast<int64_t>(at));
    EXPECT_EQ((*diff)->want, a[at]);
    EXPECT_EQ((*diff)->got, b[at]);
  }
}

TYPED_TEST(DeviceDataTest, ChecksumEqualsItsDefinitionAtOddSizesAndOffsets) {
  const size_t n = 4099;
  std::vector<uint8_t> a(n + 1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>((i * 131) ^ (i >> 3));
  DeviceBuffer da(this->backend(), a.size());
  da.upload(a);
  for (size_t offset : {size_t{0}, size_t{1}}) {
    for (size_t bytes : {size_t{1}, size_t{13}, size_t{4096}, n}) {
      SCOPED_TRACE("offset " + std::to_string(offset) + " bytes " + std::to_string(bytes));
      auto sum =
          checksum(this->backend(), Stream{}, static_cast<uint8_t*>(da.data()) + offset, bytes);
      ASSERT_OK(sum);
      EXPECT_EQ(*sum, host_checksum(a.data() + offset, bytes));
    }
  }
  // One changed byte, and two words swapped, change it.
  auto base = checksum(this->backend(), Stream{}, da.data(), n);
  ASSERT_OK(base);
  std::vector<uint8_t> b = a;
  b[2000] ^= 0x01;
  da.upload(b);
  auto changed = checksum(this->backend(), Stream{}, da.data(), n);
  ASSERT_OK(changed);
  EXPECT_NE(*changed, *base);
  b = a;
  std::swap_ranges(b.begin(), b.begin() + 8, b.begin() + 8);
  da.upload(b);
  auto swapped = checksum(this->backend(), Stream{}, da.data(), n);
  ASSERT_OK(swapped);
  EXPECT_NE(*swapped, *base);
}

TYPED_TEST(DeviceDataTest, CallsRunAfterTheStreamsQueuedWork) {
  Backend& be = this->backend();
  auto stream = be.create_stream();
  ASSERT_OK(stream);
  const int64_t n = 4096;
  DeviceBuffer buf(be, n * sizeof(uint16_t));
  const std::vector<uint8_t> zeros(n * sizeof(uint16_t), 0);
  // A spin, then a copy of zeros, both queued: the fill must land after them.
  ASSERT_OK(launch_spin(be, *stream, 20'000'000));
  ASSERT_OK(
      be.copy_async(buf.data(), zeros.data(), zeros.size(), CopyKind::kHostToDevice, *stream));
  ASSERT_OK(fill_pattern(be, *stream, buf.data(), n, DType::kFloat16, 9));
  auto sum = checksum(be, *stream, buf.data(), zeros.size());
  ASSERT_OK(sum);
  ASSERT_OK(be.synchronize_stream(*stream));
  std::vector<uint8_t> want(zeros.size());
  for (int64_t i = 0; i < n; ++i)
    store_from_float(want.data(), DType::kFloat16, i, pattern_value(9, i));
  EXPECT_EQ(*sum, host_checksum(want.data(), want.size()));
  be.destroy_stream(*stream);
}

TYPED_TEST(DeviceDataTest, BadArgumentsAreRefusedWithAMessage) {
  Backend& be = this->backend();
  DeviceBuffer buf(be, 64);
  EXPECT_EQ(fill_pattern(be, Stream{}, buf.data(), -1, DType::kFloat16, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_pattern(be, Stream{}, nullptr, 4, DType::kFloat16, 1).code(),
            StatusCode::kInvalidArgument);
  ModelRows rows;
  rows.rows = 1;
  rows.heads = 0;
  rows.head_dim = 4;
  EXPECT_EQ(fill_model_rows(be, Stream{}, static_cast<uint16_t*>(buf.data()), rows).code(),
            StatusCode::kInvalidArgument);
  rows.heads = 1;  // positions and tokens still null
  EXPECT_EQ(fill_model_rows(be, Stream{}, static_cast<uint16_t*>(buf.data()), rows).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(checksum(be, Stream{}, nullptr, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(first_mismatch(be, Stream{}, buf.data(), nullptr, 8).status().code(),
            StatusCode::kInvalidArgument);
  // Empty buffers are equal and sum to zero.
  auto none = first_mismatch(be, Stream{}, nullptr, nullptr, 0);
  ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
  auto zero = checksum(be, Stream{}, nullptr, 0);
  ASSERT_OK(zero);
  EXPECT_EQ(*zero, 0u);
}

}  // namespace
}  // namespace pagedkv::testing
