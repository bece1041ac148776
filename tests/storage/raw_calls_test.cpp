// The calls an engine driving a store itself relies on, against both stores: a borrowed put (no
// copy on the caller's thread), per-key membership, and a blocking wait for given jobs.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "storage/storage_test_util.hpp"
#include "storage/store_env.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

class RawCallTest : public StoreTest {};

uint32_t le32(const std::string& s, size_t off) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[off + size_t(i)]);
  return v;
}

TEST_P(RawCallTest, ABorrowedPutStoresTheCallersBytesWithTheirChecksum) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x5eed, 23);
  const auto blocks = random_blocks(keys.size(), layout.block_bytes, 21);
  std::vector<uint64_t> jobs;
  for (size_t begin = 0; begin < keys.size(); begin += 8) {  // jobs of 8, 8 and 7 blocks
    const size_t end = std::min(keys.size(), begin + 8);
    std::vector<StorageKey> k(keys.begin() + long(begin), keys.begin() + long(end));
    std::vector<const void*> p;
    for (size_t i = begin; i < end; ++i) p.push_back(blocks[i].data());
    auto job = tier->submit_put_borrowed(k, p);
    ASSERT_OK(job);
    jobs.push_back(*job);
  }
  for (const auto& [id, c] : collect(*tier, jobs)) EXPECT_TRUE(c.ok) << c.error;
  auto out = poisoned(keys.size(), layout.block_bytes);
  ASSERT_TRUE(finish(*tier, tier->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(out, blocks);
  // The stored header's payload CRC (offset 40) is that of the caller's bytes.
  for (size_t i : {size_t{0}, size_t{22}}) {
    const auto raw = env_->raw(layout, keys[i]);
    ASSERT_TRUE(raw.has_value());
    EXPECT_EQ(le32(*raw, 40), reference_crc32c(blocks[i].data(), blocks[i].size()));
    EXPECT_EQ(raw->substr(48), std::string(blocks[i].begin(), blocks[i].end()));
  }
  EXPECT_EQ(tier->stats().puts, int64_t(keys.size()));
  EXPECT_EQ(tier->stats().bytes_written, int64_t(keys.size()) * layout.block_bytes);
}

// The I/O threads are paused, so nothing is read before the bytes change: a borrowed put stores
// what the buffer holds when its thread runs, a copying put what it held at submit.
TEST_P(RawCallTest, ABorrowedPutReadsTheBufferOnTheStoreThreadNotAtSubmit) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xb0b0, 4);
  auto blocks = random_blocks(4, layout.block_bytes, 22);
  const auto before = blocks;
  const auto later = random_blocks(4, layout.block_bytes, 23);
  set_paused(*tier, true);
  auto borrowed =
      tier->submit_put_borrowed({keys[0], keys[1]}, {blocks[0].data(), blocks[1].data()});
  ASSERT_OK(borrowed);
  auto copied = tier->submit_put({keys[2], keys[3]}, {blocks[2].data(), blocks[3].data()});
  ASSERT_OK(copied);
  blocks = later;  // same buffers (same sizes): assigned in place
  set_paused(*tier, false);
  tier->drain();
  auto got = collect(*tier, {*borrowed, *copied});
  EXPECT_TRUE(got[*borrowed].ok) << got[*borrowed].error;
  EXPECT_TRUE(got[*copied].ok) << got[*copied].error;
  auto out = poisoned(4, layout.block_bytes);
  ASSERT_TRUE(finish(*tier, tier->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(out[0], later[0]);
  EXPECT_EQ(out[1], later[1]);
  EXPECT_EQ(out[2], before[2]);
  EXPECT_EQ(out[3], before[3]);
}

TEST_P(RawCallTest, ABorrowedPutRejectsBadInputAndAFullQueueQueuingNothing) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout, /*threads=*/1, /*max_queued=*/3);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x77, 4);
  const auto blocks = random_blocks(4, layout.block_bytes, 24);
  const auto bad = [&](StatusOr<uint64_t> r, const char* what) {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  bad(tier->submit_put_borrowed({keys[0], keys[1]}, {blocks[0].data()}), "2 keys but 1 blocks");
  bad(tier->submit_put_borrowed({}, {}), "keys is empty");
  bad(tier->submit_put_borrowed({keys[0], keys[1]}, {blocks[0].data(), nullptr}),
      "blocks[1] is null");
  set_paused(*tier, true);
  auto first = tier->submit_put_borrowed({keys[0], keys[1]}, {blocks[0].data(), blocks[1].data()});
  ASSERT_OK(first);
  auto full = tier->submit_put_borrowed({keys[2], keys[3]}, {blocks[2].data(), blocks[3].data()});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("queue full"), std::string::npos);
  EXPECT_EQ(tier->stats().rejected_puts, 2);
  set_paused(*tier, false);
  tier->drain();
  auto got = collect(*tier, {*first});
  EXPECT_TRUE(got[*first].ok);
  EXPECT_EQ(tier->batch_exists(keys).value(), 2u);
  EXPECT_EQ(tier->stats().puts, 2);
}

TEST_P(RawCallTest, ExistsEachAnswersEveryKeyNotOnlyTheLeadingOnes) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xe1, 70);  // more than one Redis pipeline chunk (32)
  std::vector<StorageKey> stored;
  std::vector<bool> want;
  for (size_t i = 0; i < keys.size(); ++i) {
    want.push_back(i % 3 != 1 && i != 0);
    if (want.back()) stored.push_back(keys[i]);
  }
  const auto blocks = random_blocks(stored.size(), layout.block_bytes, 25);
  ASSERT_TRUE(finish(*tier, tier->submit_put(stored, cptrs(blocks))).ok);
  auto each = tier->exists_each(keys);
  ASSERT_OK(each);
  EXPECT_EQ(*each, want);
  EXPECT_EQ(tier->batch_exists(keys).value(), 0u);  // the first is missing
  auto none = tier->exists_each({});
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TEST_P(RawCallTest, WaitTakesTheGivenJobsAndLeavesTheRestForPoll) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xa17, 2);
  const auto blocks = random_blocks(2, layout.block_bytes, 26);
  set_paused(*tier, true);
  auto a = tier->submit_put_borrowed({keys[0]}, {blocks[0].data()});
  auto b = tier->submit_put_borrowed({keys[1]}, {blocks[1].data()});
  ASSERT_OK(a);
  ASSERT_OK(b);
  auto timed_out = tier->wait({*a}, 30);  // paused: nothing can finish
  ASSERT_OK(timed_out);
  EXPECT_TRUE(timed_out->empty());
  set_paused(*tier, false);
  auto got = tier->wait({*a}, -1);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].job, *a);
  EXPECT_TRUE((*got)[0].ok) << (*got)[0].error;
  tier->drain();
  auto rest = collect(*tier, {*b});  // a is not reported again
  EXPECT_TRUE(rest[*b].ok);
  // Taken already, or never submitted: kNotFound, and nothing taken.
  EXPECT_EQ(tier->wait({*a}, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->wait({*b + 1000}, 0).status().code(), StatusCode::kNotFound);
}

TEST_P(RawCallTest, WaitBlocksUntilTheJobFinishes) {
  const StorageLayout layout = odd_layout();
  auto tier = make(layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xb10c, 3);
  const auto blocks = random_blocks(3, layout.block_bytes, 27);
  set_paused(*tier, true);
  auto job = tier->submit_put_borrowed(keys, cptrs(blocks));
  ASSERT_OK(job);
  const auto start = std::chrono::steady_clock::now();
  std::thread resume([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    set_paused(*tier, false);
  });
  auto got = tier->wait({*job}, 20'000);
  const auto waited = std::chrono::steady_clock::now() - start;
  resume.join();
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_TRUE((*got)[0].ok);
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_EQ(tier->batch_exists(keys).value(), 3u);
  EXPECT_TRUE(tier->poll().empty());
}

INSTANTIATE_TEST_SUITE_P(Stores, RawCallTest, ::testing::Values("file", "file_direct", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pagedkv::testing
