// A latent (MLA) store layout: from_config carries the kind and the rope split, the fingerprint
// encodes them (so a latent block is never read as a K/V block of any shape, and K/V fingerprints
// stay what they were), the layout checks name the field, and a file store round-trips latent
// blocks while a K/V store on the same directory never finds them.
#include <gtest/gtest.h>

#include <string>

#include "storage/block_format.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

// 2 layers x 1 latent of 37 (32 ckv + 5 kpe) x 3 tokens, fp16: 2 * 3 * 37 * 2 = 444 bytes.
StorageLayout latent_layout(std::string model_id = "tiny-mla") {
  StorageLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 1;
  l.head_dim = 37;
  l.block_size = 3;
  l.dtype = DType::kFloat16;
  l.page_layout = PageLayout::kNHD;
  l.kv_kind = KvKind::kLatent;
  l.rope_dim = 5;
  l.model_id = std::move(model_id);
  l.block_bytes = 444;
  return l;
}

// The documented encoding (docs/storage.md), re-implemented: the K/V string, then for a latent
// layout the kind byte and rope_dim as 4 little-endian bytes; 64-bit FNV-1a.
uint64_t reference_fingerprint(const StorageLayout& l) {
  std::string b = "pagedkv.storage.v1";
  auto put = [&b](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(char((v >> (8 * i)) & 0xFF));
  };
  put(uint32_t(l.num_layers), 4);
  put(uint32_t(l.num_kv_heads), 4);
  put(uint32_t(l.head_dim), 4);
  put(uint32_t(l.block_size), 4);
  put(uint8_t(l.dtype), 1);
  put(uint8_t(l.page_layout), 1);
  put(uint64_t(l.block_bytes), 8);
  put(l.model_id.size(), 8);
  b += l.model_id;
  if (l.kv_kind == KvKind::kLatent) {
    put(1, 1);
    put(uint32_t(l.rope_dim), 4);
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : b) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

TEST(LatentStorageLayoutTest, FromConfigCarriesTheKindAndTheRopeSplit) {
  CacheConfig cfg;
  cfg.kv_kind = KvKind::kLatent;
  cfg.num_layers = 2;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 37;
  cfg.rope_dim = 5;
  cfg.block_size = 3;
  const StorageLayout l = StorageLayout::from_config(cfg, "tiny-mla");
  EXPECT_EQ(l.kv_kind, KvKind::kLatent);
  EXPECT_EQ(l.rope_dim, 5);
  EXPECT_EQ(l.block_bytes, 444);
  EXPECT_EQ(l.fingerprint(), latent_layout().fingerprint());
  EXPECT_OK(detail::validate_storage_layout(l));
  EXPECT_EQ(StorageLayout::from_config(CacheConfig{}, "m").kv_kind, KvKind::kKeyValue);
  EXPECT_EQ(StorageLayout::from_config(CacheConfig{}, "m").rope_dim, 0);
}

TEST(LatentStorageLayoutTest, FingerprintEncodesTheKindAndRopeDim) {
  const StorageLayout base = latent_layout();
  EXPECT_EQ(base.fingerprint(), reference_fingerprint(base));
  // Every other field the same, kind K/V: another fingerprint.
  StorageLayout as_kv = base;
  as_kv.kv_kind = KvKind::kKeyValue;
  as_kv.rope_dim = 0;
  EXPECT_NE(as_kv.fingerprint(), base.fingerprint());
  EXPECT_EQ(as_kv.fingerprint(), reference_fingerprint(as_kv));
  // A K/V layout of the same block bytes (one layer of keys and values).
  StorageLayout same_bytes = as_kv;
  same_bytes.num_layers = 1;
  EXPECT_EQ(same_bytes.block_bytes, base.block_bytes);
  EXPECT_NE(same_bytes.fingerprint(), base.fingerprint());
  StorageLayout other_rope = base;
  other_rope.rope_dim = 6;
  EXPECT_NE(other_rope.fingerprint(), base.fingerprint());
  EXPECT_EQ(other_rope.fingerprint(), reference_fingerprint(other_rope));
  // K/V fingerprints are what they were before latents existed (format_test has the value).
  EXPECT_EQ(odd_layout("tiny-model/rev7").fingerprint(), 0x18f83f09c4edebbeull);
}

TEST(LatentStorageLayoutTest, MalformedLatentLayoutsNameTheField) {
  const auto check = [](StorageLayout l, const std::string& field) {
    const Status s = detail::validate_storage_layout(l);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(s.message().rfind("layout." + field + ": ", 0), 0u) << s.message();
  };
  StorageLayout l = latent_layout();
  l.num_kv_heads = 2;
  check(l, "num_kv_heads");
  l = latent_layout();
  l.rope_dim = 0;
  check(l, "rope_dim");
  l.rope_dim = 37;
  check(l, "rope_dim");
  l = latent_layout();
  l.kv_kind = static_cast<KvKind>(9);
  check(l, "kv_kind");
  l = latent_layout();
  l.block_bytes = 888;  // the K/V size of this shape
  check(l, "block_bytes");
  l = odd_layout();
  l.rope_dim = 3;
  check(l, "rope_dim");
  FileTierOptions o;
  o.directory = "/tmp/never-created-by-this-test";
  l = latent_layout();
  l.num_kv_heads = 4;
  EXPECT_EQ(make_file_tier(l, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(LatentStorageLayoutTest, FileStoreRoundTripsLatentBlocksAndKvStoreNeverFindsThem) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  FileTierOptions o;
  o.directory = dir.path();
  auto latent = make_file_tier(latent_layout(), o);
  ASSERT_OK(latent);
  const auto keys = keys_from(0x500, 3);
  const auto blocks = random_blocks(3, 444, 9);
  ASSERT_TRUE(finish(**latent, (*latent)->submit_put(keys, cptrs(blocks))).ok);
  auto out = poisoned(3, 444);
  ASSERT_TRUE(finish(**latent, (*latent)->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(out, blocks);
  // A K/V store of the same model, directory and block bytes.
  StorageLayout kv = latent_layout();
  kv.kv_kind = KvKind::kKeyValue;
  kv.rope_dim = 0;
  kv.num_layers = 1;
  auto kv_store = make_file_tier(kv, o);
  ASSERT_OK(kv_store);
  EXPECT_EQ((*kv_store)->batch_exists(keys).value(), 0u);
  auto kv_out = poisoned(1, 444);
  EXPECT_FALSE(finish(**kv_store, (*kv_store)->submit_get({keys[0]}, ptrs(kv_out))).ok);
}

}  // namespace
}  // namespace pagedkv::testing
