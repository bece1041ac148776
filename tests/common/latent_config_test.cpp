// The latent (MLA) cache configuration: validation of kv_kind / num_kv_heads / rope_dim, the
// byte sizes (one page per layer instead of two) and the pool layout made from it.
#include <gtest/gtest.h>

#include <string>

#include "pagedkv/config.hpp"
#include "pagedkv/layout.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

CacheConfig deepseek() {
  CacheConfig c;
  c.kv_kind = KvKind::kLatent;
  c.num_layers = 61;
  c.num_kv_heads = 1;
  c.head_dim = 576;
  c.rope_dim = 64;
  c.block_size = 64;
  c.dtype = DType::kBFloat16;
  return c;
}

void expect_field_error(const CacheConfig& c, const std::string& field) {
  const Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(s.message().rfind(field + ": ", 0), 0u) << s.message();
}

TEST(LatentConfig, DeepSeekShapeIsValid) {
  EXPECT_OK(deepseek().validate());
  CacheConfig odd = deepseek();
  odd.head_dim = 37;
  odd.rope_dim = 5;
  odd.block_size = 3;
  EXPECT_OK(odd.validate());
  odd.rope_dim = 36;  // the largest rope part: one ckv element left
  EXPECT_OK(odd.validate());
  odd.rope_dim = 1;
  EXPECT_OK(odd.validate());
}

TEST(LatentConfig, BadLatentShapesNameTheField) {
  CacheConfig c = deepseek();
  c.num_kv_heads = 2;
  expect_field_error(c, "num_kv_heads");
  c = deepseek();
  c.rope_dim = 0;
  expect_field_error(c, "rope_dim");
  c.rope_dim = -1;
  expect_field_error(c, "rope_dim");
  c.rope_dim = 576;
  expect_field_error(c, "rope_dim");
  c.rope_dim = 1000;
  expect_field_error(c, "rope_dim");
  c = deepseek();
  c.kv_kind = static_cast<KvKind>(7);
  expect_field_error(c, "kv_kind");
  // A K/V cache has no rope part.
  CacheConfig kv;
  kv.rope_dim = 64;
  expect_field_error(kv, "rope_dim");
}

TEST(LatentConfig, BlockAndPageBytesCountOnePagePerLayer) {
  const CacheConfig c = deepseek();
  EXPECT_EQ(c.page_bytes(), int64_t{64} * 576 * 2);
  EXPECT_EQ(c.block_bytes(), int64_t{61} * 64 * 576 * 2);
  CacheConfig kv = c;  // the same shape as keys and values: twice the block, same page
  kv.kv_kind = KvKind::kKeyValue;
  kv.rope_dim = 0;
  EXPECT_EQ(kv.page_bytes(), c.page_bytes());
  EXPECT_EQ(kv.block_bytes(), 2 * c.block_bytes());
}

TEST(LatentConfig, PoolLayoutHasOnePartAndTheRopeSplit) {
  const PoolLayout l = PoolLayout::from_config(deepseek());
  EXPECT_EQ(l.num_parts, 1);
  EXPECT_TRUE(l.is_latent());
  EXPECT_EQ(l.rope_dim, 64);
  EXPECT_EQ(l.ckv_dim(), 512);
  EXPECT_EQ(l.page_elems(), 64 * 576);
  EXPECT_EQ(l.layer_stride(), 64 * 576);
  EXPECT_EQ(l.block_elems(), int64_t{61} * 64 * 576);
  EXPECT_EQ(l.block_elems() * 2, deepseek().block_bytes());
  // Token 5 of layer 3 of block 2: [blocks][layers][bs][dim], NHD and HND alike with one head.
  EXPECT_EQ(l.element_offset(2, 3, KvPart::kKey, 5, 0, 7), ((2 * 61 + 3) * 64 + 5) * 576 + 7);
  PoolLayout hnd = l;
  hnd.page_layout = PageLayout::kHND;
  EXPECT_EQ(hnd.element_offset(2, 3, KvPart::kKey, 5, 0, 7),
            l.element_offset(2, 3, KvPart::kKey, 5, 0, 7));
  const PoolLayout kv = PoolLayout::from_config(CacheConfig{});
  EXPECT_EQ(kv.num_parts, 2);
  EXPECT_EQ(kv.rope_dim, 0);
  EXPECT_EQ(kv.layer_stride(), 2 * kv.page_elems());
}

}  // namespace
}  // namespace pagedkv
