#include "pagedkv/config.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

TEST(CacheConfig, DefaultIsValid) { EXPECT_OK(CacheConfig{}.validate()); }

TEST(CacheConfig, EachInvalidFieldIsNamed) {
  struct Case {
    const char* field;
    std::function<void(CacheConfig&)> break_it;
  };
  const std::vector<Case> cases = {
      {"num_layers", [](CacheConfig& c) { c.num_layers = 0; }},
      {"num_layers", [](CacheConfig& c) { c.num_layers = -3; }},
      {"num_kv_heads", [](CacheConfig& c) { c.num_kv_heads = 0; }},
      {"head_dim", [](CacheConfig& c) { c.head_dim = 0; }},
      {"head_dim", [](CacheConfig& c) { c.head_dim = -64; }},
      {"block_size", [](CacheConfig& c) { c.block_size = 0; }},
      {"num_device_blocks", [](CacheConfig& c) { c.num_device_blocks = 0; }},
      {"num_device_blocks", [](CacheConfig& c) { c.num_device_blocks = int64_t{1} << 31; }},
      {"num_host_blocks", [](CacheConfig& c) { c.num_host_blocks = -1; }},
      {"num_host_blocks", [](CacheConfig& c) { c.num_host_blocks = int64_t{1} << 32; }},
      {"dtype", [](CacheConfig& c) { c.dtype = static_cast<DType>(9); }},
      {"page_layout", [](CacheConfig& c) { c.page_layout = static_cast<PageLayout>(5); }},
      {"eviction_policy",
       [](CacheConfig& c) { c.eviction_policy = static_cast<EvictionPolicy>(7); }},
      {"backend", [](CacheConfig& c) { c.backend = static_cast<BackendKind>(4); }},
      {"mode", [](CacheConfig& c) { c.mode = static_cast<CacheMode>(2); }},
      {"max_sequence_length", [](CacheConfig& c) { c.max_sequence_length = 0; }},
      {"dense_initial_length", [](CacheConfig& c) { c.dense_initial_length = 0; }},
      {"dense_max_free_buffers", [](CacheConfig& c) { c.dense_max_free_buffers = -1; }},
      {"num_device_blocks",
       [](CacheConfig& c) {  // 2^30 blocks of 2^40 elements overflow
         c.num_device_blocks = int64_t{1} << 30;
         c.num_layers = 1 << 10;
         c.head_dim = 1 << 20;
         c.num_kv_heads = 1 << 10;
       }},
      // Each product on the way to a pool's byte size is checked, naming the overflowing factor.
      {"head_dim",
       [](CacheConfig& c) {  // one page: 2^30 * 2^10 * 2^30 elements
         c.block_size = 1 << 30;
         c.num_kv_heads = 1 << 10;
         c.head_dim = 1 << 30;
       }},
      {"num_layers",
       [](CacheConfig& c) {  // one page of 2^62 bytes fits, the block of 4 layers does not
         c.block_size = 1 << 30;
         c.num_kv_heads = 1;
         c.head_dim = 1 << 30;
         c.dtype = DType::kFloat32;
         c.num_layers = 4;
       }},
      {"num_host_blocks",
       [](CacheConfig& c) {  // the device pool fits, 2^31 - 1 host blocks of 2^40 bytes do not
         c.num_device_blocks = 1;
         c.num_host_blocks = (int64_t{1} << 31) - 1;
         c.block_size = 1 << 20;
         c.num_kv_heads = 1 << 4;
         c.head_dim = 1 << 10;
         c.num_layers = 1 << 3;
         c.dtype = DType::kFloat32;
       }},
      {"max_sequence_length",
       [](CacheConfig& c) {  // dense: 2^31 - 1 positions of 2^40 bytes
         c.mode = CacheMode::kDense;
         c.num_device_blocks = 1;
         c.block_size = 1;
         c.num_kv_heads = 1 << 10;
         c.head_dim = 1 << 20;
         c.num_layers = 1 << 8;
         c.dtype = DType::kFloat16;
         c.max_sequence_length = std::numeric_limits<int32_t>::max();
       }},
  };
  for (const Case& c : cases) {
    CacheConfig config;
    c.break_it(config);
    const Status s = config.validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().rfind(std::string(c.field) + ":", 0), 0u)
        << "expected the message to start with '" << c.field << ":', got " << s.message();
  }
}

TEST(CacheConfig, ByteSizesFollowTheShape) {
  CacheConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 5;
  c.head_dim = 80;
  c.block_size = 16;
  c.dtype = DType::kBFloat16;
  EXPECT_EQ(c.page_bytes(), 16 * 5 * 80 * 2);
  EXPECT_EQ(c.block_bytes(), 3 * 2 * 16 * 5 * 80 * 2);
  c.dtype = DType::kFloat8E4M3;
  EXPECT_EQ(c.block_bytes(), 3 * 2 * 16 * 5 * 80);
  c.dtype = DType::kFloat32;
  EXPECT_EQ(c.page_bytes(), 16 * 5 * 80 * 4);
}

TEST(CacheConfig, ByteSizesThatOverflowAreMinusOneAndThePoolLimitIsExact) {
  CacheConfig c;
  c.block_size = 1 << 30;
  c.num_kv_heads = 1 << 10;
  c.head_dim = 1 << 30;
  EXPECT_EQ(c.page_bytes(), -1);
  EXPECT_EQ(c.block_bytes(), -1);
  // A 2^62-byte pool (the largest power of two int64 holds) is accepted, 2^63 bytes are not.
  c = CacheConfig{};
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.block_size = 1 << 30;
  c.head_dim = 1 << 29;
  c.dtype = DType::kFloat8E4M3;
  c.num_device_blocks = 4;  // blocks of 2^60 bytes
  EXPECT_EQ(c.block_bytes(), int64_t{1} << 60);
  EXPECT_OK(c.validate());
  c.num_device_blocks = 8;  // 2^63 bytes
  EXPECT_EQ(c.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.validate().message().rfind("num_device_blocks:", 0), 0u) << c.validate().message();
}

TEST(CacheConfig, EnumNames) {
  EXPECT_STREQ(page_layout_name(PageLayout::kHND), "HND");
  EXPECT_STREQ(eviction_policy_name(EvictionPolicy::kFifo), "fifo");
  EXPECT_STREQ(backend_kind_name(BackendKind::kCuda), "cuda");
  EXPECT_STREQ(backend_kind_name(BackendKind::kNull), "null");
  EXPECT_STREQ(dtype_name(DType::kFloat8E4M3), "fp8_e4m3");
  DType t;
  ASSERT_TRUE(parse_dtype("bf16", &t));
  EXPECT_EQ(t, DType::kBFloat16);
  EXPECT_FALSE(parse_dtype("int4", &t));
}

}  // namespace
}  // namespace pagedkv
