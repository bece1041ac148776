// The behaviour both stores share, run against each: the file store in a scratch directory and
// the Redis store against a redis-server this test starts (skipped, with the reason, when the
// build has no hiredis or the machine no redis-server).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "storage/segment_files.hpp"
#include "storage/storage_test_util.hpp"
#include "storage/store_env.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

uint64_t le(const std::string& s, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[off + size_t(i)]);
  return v;
}

// `s` with the lowest bit of byte `i` flipped (unchanged when too short: the test then fails).
std::string flip(std::string s, size_t i) {
  if (i < s.size()) s.replace(i, 1, 1, static_cast<char>(s[i] ^ 0x01));
  return s;
}

TEST_P(StoreTest, RoundTripOfRandomOddSizedBlocksIsBitExact) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x1234567890abcdefull, 37);
  const auto blocks = random_blocks(37, layout.block_bytes, 1);
  std::vector<uint64_t> jobs;
  for (size_t begin = 0; begin < 37; begin += 13) {  // jobs of 13, 13 and 11 blocks
    const size_t end = std::min<size_t>(37, begin + 13);
    std::vector<StorageKey> k(keys.begin() + long(begin), keys.begin() + long(end));
    std::vector<const void*> p;
    for (size_t i = begin; i < end; ++i) p.push_back(blocks[i].data());
    auto job = tier->submit_put(k, p);
    ASSERT_OK(job);
    jobs.push_back(*job);
  }
  for (const auto& [id, c] : collect(*tier, jobs)) EXPECT_TRUE(c.ok) << c.error;

  auto out = poisoned(37, layout.block_bytes);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_TRUE(c.error.empty());
  for (size_t i = 0; i < 37; ++i) EXPECT_EQ(out[i], blocks[i]) << "block " << i;

  const StorageStats s = tier->stats();
  EXPECT_EQ(s.puts, 37);
  EXPECT_EQ(s.gets, 37);
  EXPECT_EQ(s.bytes_written, 37 * layout.block_bytes);
  EXPECT_EQ(s.bytes_read, 37 * layout.block_bytes);
  EXPECT_EQ(s.failed_puts + s.failed_gets + s.rejected_puts, 0);
}

// Another engine's blocks (an opaque layout of an odd size): stored and read back bit-exact,
// and invisible to a store of another digest.
TEST_P(StoreTest, AnOpaqueLayoutRoundTripsAndOtherDigestsMiss) {
  const StorageLayout layout = StorageLayout::opaque(3001, "engine:model-a:chunk16");
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xfeedfacecafebeefull, 9);
  const auto blocks = random_blocks(9, layout.block_bytes, 5);
  std::vector<const void*> p;
  for (const auto& b : blocks) p.push_back(b.data());
  const StorageCompletion put = finish(*tier, tier->submit_put(keys, p));
  EXPECT_TRUE(put.ok) << put.error;
  auto out = poisoned(9, layout.block_bytes);
  const StorageCompletion got = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_TRUE(got.ok) << got.error;
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(out[i], blocks[i]) << "block " << i;
  auto other = make(StorageLayout::opaque(3001, "engine:model-b:chunk16"));
  ASSERT_NE(other, nullptr);
  auto seen = other->batch_exists(keys);
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, 0u);
}

TEST_P(StoreTest, RoundTripIsBitExactForEveryDtype) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3}) {
    SCOPED_TRACE(dtype_name(dt));
    CacheConfig cfg;
    cfg.num_layers = 3;
    cfg.num_kv_heads = 5;
    cfg.head_dim = 24;
    cfg.block_size = 7;
    cfg.dtype = dt;
    const StorageLayout layout = StorageLayout::from_config(cfg, "dtype-model");
    auto tier = make(layout);
    ASSERT_NE(tier, nullptr);
    const auto keys = keys_from(0xfeed, 3, 1);
    const auto blocks = random_blocks(3, layout.block_bytes, uint32_t(dt) + 10);
    ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
    auto out = poisoned(3, layout.block_bytes);
    ASSERT_TRUE(finish(*tier, tier->submit_get(keys, ptrs(out))).ok);
    EXPECT_EQ(out, blocks);
  }
}

TEST_P(StoreTest, StoredBytesFollowTheDocumentedFormat) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const StorageKey key{0xa1b2c3d4e5f60718ull, 0x55};
  const auto blocks = random_blocks(1, layout.block_bytes, 3);
  ASSERT_TRUE(finish(*tier, tier->submit_put({key}, cptrs(blocks))).ok);
  const auto raw = env_->raw(layout, key);
  ASSERT_TRUE(raw.has_value()) << "not at the documented file path / key";
  ASSERT_EQ(raw->size(), 48u + 4104u);
  EXPECT_EQ(raw->substr(0, 4), "PKVS");
  EXPECT_EQ(le(*raw, 4, 2), 1u);   // version
  EXPECT_EQ(le(*raw, 6, 2), 48u);  // header bytes
  EXPECT_EQ(le(*raw, 8, 8), layout.fingerprint());
  EXPECT_EQ(le(*raw, 16, 8), key.ns);
  EXPECT_EQ(le(*raw, 24, 8), key.block_hash);
  EXPECT_EQ(le(*raw, 32, 8), 4104u);
  const auto* bytes = reinterpret_cast<const unsigned char*>(raw->data());
  EXPECT_EQ(le(*raw, 40, 4), reference_crc32c(bytes + 48, 4104));
  EXPECT_EQ(le(*raw, 44, 4), reference_crc32c(bytes, 44));
  EXPECT_EQ(std::vector<unsigned char>(bytes + 48, bytes + 48 + 4104), blocks[0]);
}

TEST_P(StoreTest, BatchExistsCountsTheLeadingStoredKeys) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x77, 80);
  // Stored: 0..69 and 75 (past the gap); 70..74 missing. 70 spans more than one pipeline chunk.
  std::vector<StorageKey> stored(keys.begin(), keys.begin() + 70);
  stored.push_back(keys[75]);
  const auto blocks = random_blocks(stored.size(), layout.block_bytes, 4);
  ASSERT_TRUE(finish(*tier, tier->submit_put(stored, cptrs(blocks))).ok);

  EXPECT_EQ(tier->batch_exists(keys).value(), 70u);
  EXPECT_EQ(tier->batch_exists({keys[0], keys[1], keys[2]}).value(), 3u);
  EXPECT_EQ(tier->batch_exists({keys[70], keys[0]}).value(), 0u);
  EXPECT_EQ(tier->batch_exists({keys[75], keys[74], keys[0]}).value(), 1u);
  EXPECT_EQ(tier->batch_exists({}).value(), 0u);
}

TEST_P(StoreTest, AnotherLayoutOrNamespaceNeverHits) {
  const StorageLayout layout = odd_layout("model-a");
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x99, 4, 3);
  const auto blocks = random_blocks(4, layout.block_bytes, 5);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  ASSERT_EQ(tier->batch_exists(keys).value(), 4u);

  StorageLayout other_model = odd_layout("model-b");
  StorageLayout other_pages = odd_layout("model-a");
  other_pages.page_layout = PageLayout::kNHD;
  for (const StorageLayout& other : {other_model, other_pages}) {
    auto o = make(other);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->batch_exists(keys).value(), 0u);
    auto out = poisoned(4, other.block_bytes);
    EXPECT_FALSE(finish(*o, o->submit_get(keys, ptrs(out))).ok);
    EXPECT_EQ(o->stats().failed_gets, 4);
  }
  // The same hashes in another namespace are other blocks.
  EXPECT_EQ(tier->batch_exists(keys_from(0x99, 4, 4)).value(), 0u);
}

TEST_P(StoreTest, GetOfAMissingBlockFailsTheJob) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x5, 3);
  const auto blocks = random_blocks(2, layout.block_bytes, 6);
  ASSERT_TRUE(finish(*tier, tier->submit_put({keys[0], keys[2]}, cptrs(blocks))).ok);
  auto out = poisoned(3, layout.block_bytes);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("1 of 3 blocks failed"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("not stored"), std::string::npos) << c.error;
  EXPECT_EQ(tier->stats().failed_gets, 1);
  EXPECT_EQ(tier->stats().gets, 2);
  EXPECT_EQ(c.blocks_ok, 1u) << "block 0 is good, block 1 is missing";
  EXPECT_EQ(out[0], blocks[0]);
}

// A get that fails at block 2 of 5 says that blocks 0 and 1 are good, and they hold exactly
// what was put (the caller may use them); a get that succeeds says all are.
TEST_P(StoreTest, AFailedGetSaysHowManyLeadingBlocksAreGood) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xbadb10c, 5);
  const auto blocks = random_blocks(5, layout.block_bytes, 11);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  auto all = poisoned(5, layout.block_bytes);
  const StorageCompletion good = finish(*tier, tier->submit_get(keys, ptrs(all)));
  EXPECT_TRUE(good.ok);
  EXPECT_EQ(good.blocks_ok, 5u);
  env_->write_raw(layout, keys[2], flip(env_->raw(layout, keys[2]).value(), 48 + 100));
  auto out = poisoned(5, layout.block_bytes);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.blocks_ok, 2u) << c.error;
  EXPECT_EQ(out[0], blocks[0]);
  EXPECT_EQ(out[1], blocks[1]);
  const StorageCompletion put = finish(*tier, tier->submit_put({keys[0]}, cptrs({blocks[0]})));
  EXPECT_EQ(put.blocks_ok, 0u) << "puts say nothing of blocks read";
}

// A corrupt, truncated or foreign stored block reads as a failed get: the completion says so
// and the caller registers nothing (what the destination holds is then unspecified).
TEST_P(StoreTest, CorruptTruncatedOrForeignBlockIsAFailedGet) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xc0ffee, 6);
  const auto blocks = random_blocks(6, layout.block_bytes, 7);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);

  struct Case {
    const char* name;
    std::function<std::string(std::string)> damage;
    const char* reason;
  };
  const std::string foreign = env_->raw(layout, keys[5]).value();
  const std::vector<Case> cases = {
      {"payload byte flipped", [](std::string s) { return flip(std::move(s), 48 + 2000); },
       "payload checksum"},
      {"header byte flipped", [](std::string s) { return flip(std::move(s), 20); },
       "header checksum"},
      {"truncated", [](std::string s) { return s.substr(0, s.size() - 100); },
       env_->short_block_reason()},
      {"header only", [](std::string s) { return s.substr(0, 48); }, env_->short_block_reason()},
      {"another key's block", [&](std::string) { return foreign; }, "another key"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    env_->write_raw(layout, keys[i], cases[i].damage(env_->raw(layout, keys[i]).value()));
    auto out = poisoned(1, layout.block_bytes);
    const int64_t failed_before = tier->stats().failed_gets;
    const StorageCompletion c = finish(*tier, tier->submit_get({keys[i]}, ptrs(out)));
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.error.find(cases[i].reason), std::string::npos) << c.error;
    EXPECT_EQ(tier->stats().failed_gets, failed_before + 1);
  }
  // The intact block still reads back.
  auto out = poisoned(1, layout.block_bytes);
  EXPECT_TRUE(finish(*tier, tier->submit_get({keys[5]}, ptrs(out))).ok);
  EXPECT_EQ(out[0], blocks[5]);
}

// One I/O thread reads the whole job as one batch (the Redis store pipelines its GETs): damaged
// and missing blocks among intact ones fail alone, and the store keeps its place in the stream
// of replies (a second get of the intact blocks reads them back too).
TEST_P(StoreTest, BadBlocksInOneBatchFailAloneAndTheRestReadBack) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout, /*threads=*/1);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xba7c4, 9);
  const auto blocks = random_blocks(9, layout.block_bytes, 17);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  const std::string good = env_->raw(layout, keys[2]).value();
  env_->write_raw(layout, keys[2], good.substr(0, good.size() - 100));  // cut short
  env_->write_raw(layout, keys[5], flip(env_->raw(layout, keys[5]).value(), 48 + 7));
  ASSERT_OK(tier->remove({keys[7]}));
  tier->drain();
  auto out = poisoned(9, layout.block_bytes);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.blocks_ok, 2u);
  EXPECT_NE(c.error.find("3 of 9 blocks failed"), std::string::npos) << c.error;
  EXPECT_EQ(tier->stats().failed_gets, 3);
  EXPECT_EQ(tier->stats().gets, 6);
  for (size_t i : {0, 1, 3, 4, 6, 8}) EXPECT_EQ(out[i], blocks[i]) << "block " << i;
  const std::vector<StorageKey> intact = {keys[8], keys[0], keys[6], keys[1], keys[4], keys[3]};
  auto again = poisoned(6, layout.block_bytes);
  const StorageCompletion c2 = finish(*tier, tier->submit_get(intact, ptrs(again)));
  EXPECT_TRUE(c2.ok) << c2.error;
  const size_t order[] = {8, 0, 6, 1, 4, 3};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(again[i], blocks[order[i]]) << "block " << order[i];
}

TEST_P(StoreTest, FullWriteQueueRejectsTheWholeJob) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout, /*threads=*/1, /*max_queued=*/4);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x42, 6);
  const auto blocks = random_blocks(6, layout.block_bytes, 8);
  set_paused(*tier, true);  // nothing is written until resumed: the queue stays as filled
  auto first = tier->submit_put({keys[0], keys[1], keys[2]},
                                {blocks[0].data(), blocks[1].data(), blocks[2].data()});
  ASSERT_OK(first);
  auto rejected = tier->submit_put({keys[3], keys[4]}, {blocks[3].data(), blocks[4].data()});
  EXPECT_EQ(rejected.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(rejected.status().message().find("queue full"), std::string::npos);
  auto too_big = tier->submit_put(keys, cptrs(blocks));
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  auto last = tier->submit_put({keys[5]}, {blocks[5].data()});
  ASSERT_OK(last);
  // Gets are not bounded by the write queue.
  auto out = poisoned(1, layout.block_bytes);
  auto get = tier->submit_get({keys[0]}, ptrs(out));
  EXPECT_OK(get);
  EXPECT_EQ(tier->stats().rejected_puts, 2 + 6);
  set_paused(*tier, false);
  tier->drain();
  auto got = collect(*tier, {*first, *last, *get});
  EXPECT_TRUE(got[*first].ok && got[*last].ok);
  EXPECT_EQ(tier->batch_exists({keys[0], keys[1], keys[2]}).value(), 3u);
  EXPECT_EQ(tier->batch_exists({keys[3]}).value(), 0u);
  EXPECT_EQ(tier->batch_exists({keys[4]}).value(), 0u);
  EXPECT_EQ(tier->batch_exists({keys[5]}).value(), 1u);
  EXPECT_EQ(tier->stats().puts, 4);
}

TEST_P(StoreTest, ManyJobsInFlightAllCompleteOnce) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout, /*threads=*/4);
  ASSERT_NE(tier, nullptr);
  constexpr size_t kJobs = 48, kPerJob = 5;
  const auto keys = keys_from(0xabc, kJobs * kPerJob);
  const auto blocks = random_blocks(keys.size(), layout.block_bytes, 9);
  std::vector<uint64_t> jobs;
  for (size_t j = 0; j < kJobs; ++j) {
    std::vector<StorageKey> k(keys.begin() + long(j * kPerJob),
                              keys.begin() + long((j + 1) * kPerJob));
    std::vector<const void*> p;
    for (size_t i = j * kPerJob; i < (j + 1) * kPerJob; ++i) p.push_back(blocks[i].data());
    auto job = tier->submit_put(k, p);
    ASSERT_OK(job);
    jobs.push_back(*job);
  }
  for (const auto& [id, c] : collect(*tier, jobs)) EXPECT_TRUE(c.ok) << c.error;

  auto out = poisoned(keys.size(), layout.block_bytes);
  jobs.clear();
  for (size_t j = 0; j < kJobs; ++j) {
    std::vector<StorageKey> k(keys.begin() + long(j * kPerJob),
                              keys.begin() + long((j + 1) * kPerJob));
    std::vector<void*> p;
    for (size_t i = j * kPerJob; i < (j + 1) * kPerJob; ++i) p.push_back(out[i].data());
    jobs.push_back(tier->submit_get(k, p).value());
  }
  for (const auto& [id, c] : collect(*tier, jobs)) EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(out, blocks);
  EXPECT_TRUE(tier->poll().empty());
  EXPECT_EQ(tier->stats().puts, int64_t(keys.size()));
  EXPECT_EQ(tier->stats().gets, int64_t(keys.size()));
}

TEST_P(StoreTest, RemoveDeletesStoredBlocksAndIgnoresMissingOnes) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x31, 4);
  const auto blocks = random_blocks(3, layout.block_bytes, 10);
  ASSERT_TRUE(finish(*tier, tier->submit_put({keys[0], keys[1], keys[2]}, cptrs(blocks))).ok);
  ASSERT_OK(tier->remove({keys[1], keys[3]}));
  tier->drain();
  EXPECT_EQ(tier->stats().removed, 1);
  EXPECT_EQ(tier->batch_exists({keys[0]}).value(), 1u);
  EXPECT_EQ(tier->batch_exists({keys[1]}).value(), 0u);
  EXPECT_FALSE(env_->raw(layout, keys[1]).has_value());
  EXPECT_TRUE(tier->poll().empty()) << "a removal is not a job";
}

TEST_P(StoreTest, MalformedCallsAreRejectedAndQueueNothing) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x8, 2);
  const auto blocks = random_blocks(2, layout.block_bytes, 11);
  auto out = poisoned(2, layout.block_bytes);
  EXPECT_EQ(tier->submit_put(keys, {blocks[0].data()}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->submit_put({}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->submit_put(keys, {blocks[0].data(), nullptr}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->submit_get(keys, {out[0].data()}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->submit_get(keys, {nullptr, out[1].data()}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tier->submit_get({}, {}).status().code(), StatusCode::kInvalidArgument);
  tier->drain();
  EXPECT_TRUE(tier->poll().empty());
  const StorageStats s = tier->stats();
  EXPECT_EQ(s.puts + s.gets + s.failed_puts + s.failed_gets + s.rejected_puts, 0);
  EXPECT_EQ(tier->batch_exists(keys).value(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("file", "file_direct", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedkv::testing
