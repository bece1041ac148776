// The layout fingerprint, the CRC-32C and the layout checks, against values derived outside the
// code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "storage/block_format.hpp"
#include "storage/crc32c.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

// The documented encoding, re-implemented here: tag, four int32, two bytes, int64, the model id's
// length as uint64 and its bytes, all little-endian; then 64-bit FNV-1a.
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
  if (l.tp_size != 1 || l.tp_rank != 0) {  // a tensor-parallel rank's layout
    put(0x7A, 1);
    put(uint32_t(l.tp_size), 4);
    put(uint32_t(l.tp_rank), 4);
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : b) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

TEST(StorageLayoutTest, FingerprintOfAFixedLayoutIsTheDocumentedValue) {
  // Computed once with a separate Python script over the documented encoding (docs/storage.md);
  // it must never change, or every store written so far stops hitting.
  EXPECT_EQ(odd_layout("tiny-model/rev7").fingerprint(), 0x18f83f09c4edebbeull);
  EXPECT_EQ(odd_layout("tiny-model/rev7").fingerprint(),
            reference_fingerprint(odd_layout("tiny-model/rev7")));
}

TEST(StorageLayoutTest, EveryFieldChangesTheFingerprint) {
  const StorageLayout base = odd_layout();
  std::vector<StorageLayout> variants(8, base);
  variants[0].num_layers = 2;
  variants[1].num_kv_heads = 26;
  variants[2].head_dim = 18;
  variants[3].block_size = 5;
  variants[4].dtype = DType::kFloat16;
  variants[5].page_layout = PageLayout::kNHD;
  variants[6].model_id = "tiny-model/rev8";
  variants[7].block_bytes = 4105;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(variants[i].fingerprint(), base.fingerprint()) << "variant " << i;
    EXPECT_EQ(variants[i].fingerprint(), reference_fingerprint(variants[i])) << "variant " << i;
  }
  // The model id's length is encoded, so moving bytes between fields cannot collide.
  StorageLayout a = base, b = base;
  a.model_id = "ab";
  b.model_id = std::string("ab\0", 3);
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

// A tensor-parallel rank's layout (StorageLayout::for_rank) appends the TP size and the rank:
// no two ranks, no two TP sizes and no unsharded layout share a fingerprint.
TEST(StorageLayoutTest, ATensorParallelRanksLayoutNamesTheSizeAndTheRank) {
  CacheConfig part;
  part.num_layers = 2;
  part.num_kv_heads = 2;
  part.head_dim = 8;
  part.block_size = 4;
  const StorageLayout r0 = StorageLayout::for_rank(part, "m", 2, 0);
  const StorageLayout r1 = StorageLayout::for_rank(part, "m", 2, 1);
  const StorageLayout of4 = StorageLayout::for_rank(part, "m", 4, 0);
  const StorageLayout plain = StorageLayout::from_config(part, "m");
  EXPECT_EQ(r1.tp_size, 2);
  EXPECT_EQ(r1.tp_rank, 1);
  EXPECT_EQ(r1.num_kv_heads, 2);
  std::vector<uint64_t> prints;
  for (const StorageLayout& l : {r0, r1, of4, plain}) {
    EXPECT_OK(detail::validate_storage_layout(l));
    EXPECT_EQ(l.fingerprint(), reference_fingerprint(l));
    prints.push_back(l.fingerprint());
  }
  std::sort(prints.begin(), prints.end());
  EXPECT_EQ(std::unique(prints.begin(), prints.end()), prints.end()) << "two layouts collide";
  EXPECT_EQ(StorageLayout::for_rank(part, "m", 1, 0).fingerprint(), plain.fingerprint());
  StorageLayout bad = r1;
  bad.tp_rank = 2;
  EXPECT_EQ(detail::validate_storage_layout(bad).code(), StatusCode::kInvalidArgument);
  bad.tp_size = 0;
  bad.tp_rank = 0;
  EXPECT_EQ(detail::validate_storage_layout(bad).code(), StatusCode::kInvalidArgument);
}

TEST(StorageLayoutTest, FromConfigCopiesTheShapeAndTheBlockSize) {
  CacheConfig cfg;
  cfg.num_layers = 6;
  cfg.num_kv_heads = 3;
  cfg.head_dim = 40;
  cfg.block_size = 8;
  cfg.dtype = DType::kBFloat16;
  cfg.page_layout = PageLayout::kHND;
  const StorageLayout l = StorageLayout::from_config(cfg, "m");
  EXPECT_EQ(l.num_layers, 6);
  EXPECT_EQ(l.num_kv_heads, 3);
  EXPECT_EQ(l.head_dim, 40);
  EXPECT_EQ(l.block_size, 8);
  EXPECT_EQ(l.dtype, DType::kBFloat16);
  EXPECT_EQ(l.page_layout, PageLayout::kHND);
  EXPECT_EQ(l.model_id, "m");
  EXPECT_EQ(l.block_bytes, 6 * 2 * 8 * 3 * 40 * 2);
  EXPECT_OK(detail::validate_storage_layout(l));
}

TEST(StorageLayoutTest, MalformedLayoutsNameTheField) {
  const auto check = [](StorageLayout l, const char* field) {
    const Status s = detail::validate_storage_layout(l);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  StorageLayout l = odd_layout();
  l.num_layers = 0;
  check(l, "num_layers");
  l = odd_layout();
  l.head_dim = -1;
  check(l, "head_dim");
  l = odd_layout();
  l.dtype = static_cast<DType>(9);
  check(l, "dtype");
  l = odd_layout();
  l.page_layout = static_cast<PageLayout>(7);
  check(l, "page_layout");
  l = odd_layout();
  l.block_bytes = 4100;
  check(l, "block_bytes");
  FileTierOptions o;
  o.directory = "/tmp/never-created-by-this-test";
  l = odd_layout();
  l.block_bytes = 0;
  EXPECT_EQ(make_file_tier(l, o).status().code(), StatusCode::kInvalidArgument);
}

// An engine's own blocks (StorageLayout::opaque): any byte size, named by the engine's digest,
// never confused with a pagedkv layout or another digest.
TEST(StorageLayoutTest, AnOpaqueLayoutIsNamedByItsDigestAndSize) {
  const StorageLayout a = StorageLayout::opaque(1000, "vllm:llama-3-8b:bf16:16:tp1");
  EXPECT_OK(detail::validate_storage_layout(a));
  EXPECT_EQ(a.block_bytes, 1000);
  EXPECT_EQ(a.num_layers, 0);
  EXPECT_NE(a.fingerprint(),
            StorageLayout::opaque(1000, "vllm:llama-3-8b:bf16:16:tp2").fingerprint());
  EXPECT_NE(a.fingerprint(),
            StorageLayout::opaque(1001, "vllm:llama-3-8b:bf16:16:tp1").fingerprint());
  EXPECT_EQ(a.fingerprint(),
            StorageLayout::opaque(1000, "vllm:llama-3-8b:bf16:16:tp1").fingerprint());
  // Not the fingerprint of a pagedkv layout with the digest as its model id.
  StorageLayout named = odd_layout(a.engine_digest);
  EXPECT_NE(a.fingerprint(), named.fingerprint());

  const auto refused = [](StorageLayout l, const char* field) {
    const Status s = detail::validate_storage_layout(l);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  refused(StorageLayout::opaque(0, "d"), "block_bytes");
  refused(StorageLayout::opaque(-5, "d"), "block_bytes");
  StorageLayout shaped = StorageLayout::opaque(4104, "d");
  shaped.num_layers = 1;
  refused(shaped, "engine_digest");
}

TEST(Crc32cTest, MatchesThePublishedCheckValues) {
  // "123456789" (the CRC catalogue's check value) and the RFC 3720 (iSCSI) B.4 vectors.
  const char* digits = "123456789";
  unsigned char zeros[32] = {}, ones[32], inc[32];
  std::memset(ones, 0xFF, sizeof(ones));
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<unsigned char>(i);
  for (bool portable : {true, false}) {
    SCOPED_TRACE(portable ? "portable" : "dispatched");
    const auto crc = [portable](const void* p, size_t n) {
      return portable ? detail::crc32c_portable(p, n) : detail::crc32c(p, n);
    };
    EXPECT_EQ(crc(digits, 9), 0xE3069283u);
    EXPECT_EQ(crc(zeros, 32), 0x8A9136AAu);
    EXPECT_EQ(crc(ones, 32), 0x62A8AB43u);
    EXPECT_EQ(crc(inc, 32), 0x46DD794Eu);
  }
}

TEST(Crc32cTest, HardwareAndPortableAgreeAtEveryLengthAndAlignment) {
  const auto data = random_blocks(1, 300, 12)[0];
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n = 0; off + n <= data.size(); n += 7) {
      ASSERT_EQ(detail::crc32c(data.data() + off, n), detail::crc32c_portable(data.data() + off, n))
          << "offset " << off << " length " << n;
    }
  }
  // Long inputs take the three-stream paths (stretches of 256 and 8192 bytes) and their joins.
  const auto big = random_blocks(1, 60000, 13)[0];
  for (size_t n : {767, 768, 769, 3000, 24575, 24576, 24583, 33000, 59999}) {
    for (size_t off : {0, 1}) {
      ASSERT_EQ(detail::crc32c(big.data() + off, n), detail::crc32c_portable(big.data() + off, n))
          << "offset " << off << " length " << n;
    }
  }
  // The copying variant copies and agrees.
  for (size_t n : {0, 7, 769, 24583, 59999}) {
    std::vector<unsigned char> copy(n + 1, 0xA5);
    EXPECT_EQ(detail::crc32c_copy(copy.data(), big.data() + 1, n),
              detail::crc32c_portable(big.data() + 1, n))
        << n;
    EXPECT_TRUE(std::equal(copy.begin(), copy.begin() + long(n), big.begin() + 1)) << n;
    EXPECT_EQ(copy[n], 0xA5) << "wrote past the end";
  }
  // Continuing a CRC over a split equals the CRC of the whole.
  EXPECT_EQ(detail::crc32c(data.data() + 100, 200, detail::crc32c(data.data(), 100)),
            detail::crc32c(data.data(), 300));
}

}  // namespace
}  // namespace pagedkv::testing
