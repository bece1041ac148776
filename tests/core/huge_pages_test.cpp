// HugeVector: a large array starts on a 2 MiB boundary (so that every one of its pages can be a
// huge page), a small one comes from the ordinary allocator; both are value-initialised and
// copy like any vector.
#include "core/huge_pages.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace pagedkv {
namespace core {
namespace {

TEST(HugeVector, LargeArraysStartOnAHugePageAndAllAreZeroed) {
  for (const size_t bytes :
       {size_t{100}, kHugePageThreshold - 8, kHugePageThreshold, 3 * kHugePageThreshold + 24}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    HugeVector<uint64_t> v;
    resize_huge(&v, bytes / sizeof(uint64_t));
    ASSERT_EQ(v.size(), bytes / sizeof(uint64_t));
    if (bytes >= kHugePageThreshold) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
    }
    for (const uint64_t x : v) ASSERT_EQ(x, 0u);
    v.back() = 7;
    const HugeVector<uint64_t> copy = v;
    EXPECT_EQ(copy.back(), 7u);
    EXPECT_EQ(copy.size(), v.size());
  }
}

}  // namespace
}  // namespace core
}  // namespace pagedkv
