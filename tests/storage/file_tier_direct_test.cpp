// The file store with O_DIRECT appends (FileTierOptions::direct_io): aligned records of odd and
// page-multiple sizes read back bit-exact, restarts with and without the option, torn tails, a
// writer killed mid-job, and the fallback where the filesystem refuses O_DIRECT (tmpfs).
#include <fcntl.h>
#include <signal.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>

#include "storage/file_tier.hpp"
#include "storage/killed_writer.hpp"
#include "storage/segment_files.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kAlign = 4096;
constexpr int64_t kPayload = 4104;  // odd_layout(): not a multiple of 4096
// One record of odd_layout() (88 header bytes and the payload) rounded up to the alignment.
constexpr int64_t kStride = (88 + kPayload + kAlign - 1) / kAlign * kAlign;

class FileTierDirectTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }
  FileTierOptions options(int32_t threads = 2, bool direct = true) const {
    FileTierOptions o;
    o.directory = dir_.path();
    o.threads = threads;
    o.direct_io = direct;
    return o;
  }
  std::unique_ptr<StorageTier> make(const FileTierOptions& o,
                                    const StorageLayout& layout = odd_layout()) {
    auto t = make_file_tier(layout, o);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  }
  void put(StorageTier& t, const std::vector<StorageKey>& keys,
           const std::vector<std::vector<unsigned char>>& blocks) {
    const StorageCompletion c = finish(t, t.submit_put(keys, cptrs(blocks)));
    ASSERT_TRUE(c.ok) << c.error;
  }
  void expect_reads(StorageTier& t, const std::vector<StorageKey>& keys,
                    const std::vector<std::vector<unsigned char>>& want) {
    auto out = poisoned(keys.size(), static_cast<int64_t>(want.at(0).size()));
    const StorageCompletion c = finish(t, t.submit_get(keys, ptrs(out)));
    EXPECT_TRUE(c.ok) << c.error;
    EXPECT_EQ(out, want);
  }
  TempDir dir_;
};

// Record sizes below, at and above a page multiple: every record starts on a 4096-byte
// boundary, every block reads back, across segments and threads. Payloads of whole pages are
// written as version 3 (each payload on a page boundary, records no larger than version 2's).
TEST_F(FileTierDirectTest, AlignedRecordsOfOddAndPageMultipleSizesRoundTrip) {
  const std::vector<StorageLayout> layouts = {
      odd_layout(), StorageLayout::opaque(3001, "direct:odd"),
      StorageLayout::opaque(8192 - 88, "direct:exact"),  // a record of exactly two pages
      StorageLayout::opaque(12288, "direct:pages")};     // a payload of three pages
  for (const StorageLayout& layout : layouts) {
    SCOPED_TRACE(std::to_string(layout.block_bytes) + " bytes");
    const int64_t stride = (88 + layout.block_bytes + kAlign - 1) / kAlign * kAlign;
    FileTierOptions o = options(/*threads=*/3);
    o.segment_bytes = kAlign + 5 * stride + 40;  // five records a segment
    const auto keys = keys_from(0xd1ec7 + uint64_t(layout.block_bytes), 37);
    const auto blocks = random_blocks(37, layout.block_bytes, uint32_t(layout.block_bytes));
    {
      auto tier = make(o, layout);
      ASSERT_NE(tier, nullptr);
      for (size_t begin = 0; begin < 37; begin += 10) {  // jobs of 10, 10, 10 and 7
        const size_t end = std::min<size_t>(37, begin + 10);
        put(*tier, {keys.begin() + long(begin), keys.begin() + long(end)},
            {blocks.begin() + long(begin), blocks.begin() + long(end)});
      }
      expect_reads(*tier, keys, blocks);
      const StorageStats s = tier->stats();
      EXPECT_EQ(s.puts, 37);
      EXPECT_EQ(s.gets, 37);
      EXPECT_EQ(s.bytes_written, 37 * layout.block_bytes);
      // A whole number of aligned units on disk, and a sealed segment its 40-byte seal.
      for (const std::string& p : segment_files(dir_.path(), layout)) {
        const int64_t size = int64_t(fs::file_size(p));
        EXPECT_TRUE(size % kAlign == 0 || size % kAlign == 40) << p << ": " << size;
      }
    }
    const auto files = segment_files(dir_.path(), layout);
    EXPECT_GE(files.size(), 8u);  // 37 records, at most five a segment
    size_t records = 0;
    const bool whole_pages = layout.block_bytes % kAlign == 0;
    for (const std::string& p : files) {
      const SegmentFormat f = segment_format(file_bytes(p));
      EXPECT_EQ(f.version, whole_pages ? 3 : 2) << p;
      EXPECT_EQ(f.align, uint64_t(kAlign)) << p;
    }
    for (const RecordAt& r : all_records(dir_.path(), layout)) {
      EXPECT_EQ(r.offset % kAlign, 0) << r.path << ":" << r.offset;
      if (r.type != 1) continue;
      ++records;
      // Version 3: the headers at the record's start, zeros, the payload on the next page.
      const std::string s = file_bytes(r.path);
      const auto payload_at = size_t(r.offset + (whole_pages ? kAlign : 88));
      const std::string zeros(size_t(whole_pages ? kAlign - 88 : 0), '\0');
      EXPECT_EQ(s.compare(size_t(r.offset + 88), zeros.size(), zeros), 0) << r.offset;
      EXPECT_TRUE(std::any_of(
          blocks.begin(), blocks.end(),
          [&](const auto& b) {
            return s.compare(payload_at, b.size(),
                             std::string(reinterpret_cast<const char*>(b.data()), b.size())) == 0;
          }))
          << "no block's payload at " << payload_at;
    }
    EXPECT_EQ(records, 37u);
  }
}

// A restart rebuilds the index of aligned segments, with direct_io or without; a store without
// it adds packed segments beside them, and one with it reads both.
TEST_F(FileTierDirectTest, RestartsReadAlignedAndPackedSegmentsWithOrWithoutTheOption) {
  const auto keys = keys_from(0xa11, 12);
  const auto blocks = random_blocks(12, kPayload, 41);
  const std::vector<StorageKey> first(keys.begin(), keys.begin() + 6),
      second(keys.begin() + 6, keys.end());
  const std::vector<std::vector<unsigned char>> first_blocks(blocks.begin(), blocks.begin() + 6),
      second_blocks(blocks.begin() + 6, blocks.end());
  {
    auto tier = make(options(2, /*direct=*/true));
    ASSERT_NE(tier, nullptr);
    put(*tier, first, first_blocks);
  }
  {
    auto tier = make(options(2, /*direct=*/false));
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->batch_exists(first).value(), 6u);
    expect_reads(*tier, first, first_blocks);
    put(*tier, second, second_blocks);
  }
  std::set<int> versions;
  for (const std::string& p : segment_files(dir_.path(), odd_layout())) {
    versions.insert(segment_format(file_bytes(p)).version);
  }
  EXPECT_EQ(versions, (std::set<int>{1, 2}));
  auto tier = make(options(2, /*direct=*/true));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->batch_exists(keys).value(), 12u);
  expect_reads(*tier, keys, blocks);
  ASSERT_OK(tier->remove({keys[1], keys[8]}));
  tier->drain();
  tier.reset();
  tier = make(options(1, /*direct=*/true));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->exists_each(keys).value(),
            (std::vector<bool>{true, false, true, true, true, true, true, true, false, true, true,
                               true}));
}

// A crash mid-append leaves the last aligned record torn and no seal. Restart: that block
// misses, every other one reads right, new puts append after the good records.
TEST_F(FileTierDirectTest, ATornAlignedTailIsDiscardedAtRestart) {
  struct Tear {
    const char* name;
    std::function<void(const std::string&, int64_t)> apply;  // segment path, last record offset
  };
  const std::vector<Tear> tears = {
      {"cut in the payload",
       [](const std::string& p, int64_t last) { fs::resize_file(p, last + 1000); }},
      {"cut in the padding",  // the record is whole: it stays
       [](const std::string& p, int64_t last) { fs::resize_file(p, last + 88 + kPayload + 10); }},
      {"payload scribbled",
       [](const std::string& p, int64_t last) { write_at(p, last + 88 + 4000, "scribble"); }},
      {"header scribbled",
       [](const std::string& p, int64_t last) { write_at(p, last + 3, "\x7f"); }},
  };
  for (const Tear& tear : tears) {
    SCOPED_TRACE(tear.name);
    const bool record_survives = std::string(tear.name) == "cut in the padding";
    TempDir dir;
    FileTierOptions o = options(/*threads=*/1);
    o.directory = dir.path();
    const auto keys = keys_from(0x7000, 5);
    const auto blocks = random_blocks(5, kPayload, 52);
    {
      auto tier = make(o);
      ASSERT_NE(tier, nullptr);
      put(*tier, keys, blocks);
    }
    const auto files = segment_files(dir.path(), odd_layout());
    ASSERT_EQ(files.size(), 1u);
    const std::string seg = files[0];
    const int64_t last = kAlign + 4 * kStride;
    ASSERT_EQ(int64_t(fs::file_size(seg)), last + kStride + 40);  // five records, the seal
    fs::resize_file(seg, last + kStride);                         // no seal: its writer died
    tear.apply(seg, last);

    auto tier = make(o);
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->batch_exists(keys).value(), record_survives ? 5u : 4u);
    expect_reads(*tier, {keys.begin(), keys.begin() + 4}, {blocks.begin(), blocks.begin() + 4});
    const auto more = keys_from(0x7700, 3);
    const auto more_blocks = random_blocks(3, kPayload, 53);
    put(*tier, more, more_blocks);
    put(*tier, {keys[4]}, {blocks[4]});
    expect_reads(*tier, more, more_blocks);
    expect_reads(*tier, {keys[4]}, {blocks[4]});
    for (const RecordAt& r : all_records(dir.path(), odd_layout())) {
      EXPECT_EQ(r.offset % kAlign, 0) << r.path << ":" << r.offset;
    }
  }
}

// The same for version 3 records (payloads of whole pages, each on a page boundary after its
// record's zero-padded header page): a tear in the payload, in the padding before it or in the
// header drops the last block at restart; the others read right.
TEST_F(FileTierDirectTest, ATornPayloadAlignedTailIsDiscardedAtRestart) {
  const StorageLayout layout = StorageLayout::opaque(8192, "direct:v3");
  const int64_t stride = kAlign + 8192;
  const std::vector<std::pair<const char*, std::function<void(const std::string&, int64_t)>>>
      tears = {
          {"cut in the payload",
           [](const std::string& p, int64_t last) { fs::resize_file(p, last + kAlign + 5000); }},
          {"cut before the payload",
           [](const std::string& p, int64_t last) { fs::resize_file(p, last + 88 + 10); }},
          {"payload scribbled",
           [](const std::string& p, int64_t last) { write_at(p, last + kAlign + 8000, "x"); }},
          {"header scribbled",
           [](const std::string& p, int64_t last) { write_at(p, last + 9, "\x7f"); }},
      };
  for (const auto& [name, apply] : tears) {
    SCOPED_TRACE(name);
    TempDir dir;
    FileTierOptions o = options(/*threads=*/1);
    o.directory = dir.path();
    const auto keys = keys_from(0x7300, 5);
    const auto blocks = random_blocks(5, layout.block_bytes, 54);
    {
      auto tier = make(o, layout);
      ASSERT_NE(tier, nullptr);
      put(*tier, keys, blocks);
    }
    const auto files = segment_files(dir.path(), layout);
    ASSERT_EQ(files.size(), 1u);
    ASSERT_EQ(segment_format(file_bytes(files[0])).version, 3);
    const int64_t last = kAlign + 4 * stride;
    ASSERT_EQ(int64_t(fs::file_size(files[0])), last + stride + 40);  // five records, the seal
    fs::resize_file(files[0], last + stride);                         // no seal
    apply(files[0], last);
    auto tier = make(o, layout);
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->batch_exists(keys).value(), 4u);
    expect_reads(*tier, {keys.begin(), keys.begin() + 4}, {blocks.begin(), blocks.begin() + 4});
    put(*tier, {keys[4]}, {blocks[4]});
    expect_reads(*tier, keys, blocks);
  }
}

// kill -9 of a writer mid-job, then a restart: every block that reads back reads right, every
// job the writer reported finished reads back whole, and the store takes new puts.
TEST_F(FileTierDirectTest, AWriterKilledMidJobLeavesOnlyVerifiedBlocks) {
  FileTierOptions o = options();
  o.segment_bytes = kAlign + 16 * kStride + 40;
  kill_writer_mid_job_and_restart(o, kPayload, 0x20000000ull, 2000);
}

// Where the filesystem refuses O_DIRECT (EINVAL: tmpfs before Linux 6.6) the store is made
// anyway and writes packed version 1 segments through the page cache, as without the option.
// On a kernel whose tmpfs takes O_DIRECT the refusal comes from the test seam instead.
TEST_F(FileTierDirectTest, WhereTheFilesystemRefusesODirectPutsGoThroughThePageCache) {
  struct statfs st {};
  if (::statfs("/dev/shm", &st) != 0 || st.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  char pattern[] = "/dev/shm/pagedkv-direct-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  const bool tmpfs_takes_direct = fd >= 0;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  detail::refuse_direct_io_for_testing(tmpfs_takes_direct);
  struct Restore {
    ~Restore() { detail::refuse_direct_io_for_testing(false); }
  } restore;
  FileTierOptions o = options();
  o.directory = dir;
  const auto keys = keys_from(0xf00, 9);
  const auto blocks = random_blocks(9, kPayload, 61);
  {
    auto tier = make(o);
    ASSERT_NE(tier, nullptr);
    put(*tier, keys, blocks);
    expect_reads(*tier, keys, blocks);
  }
  const auto files = segment_files(dir, odd_layout());
  ASSERT_FALSE(files.empty());
  for (const std::string& p : files) EXPECT_EQ(segment_format(file_bytes(p)).version, 1) << p;
  const auto records = all_records(dir, odd_layout());
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records[0].offset, 32);  // packed: right after the segment header
  {
    auto tier = make(o);
    ASSERT_NE(tier, nullptr);
    expect_reads(*tier, keys, blocks);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_F(FileTierDirectTest, ABoundTooSmallForOneAlignedSegmentIsRejected) {
  FileTierOptions o = options();
  // Room for one packed segment of one block, not for an aligned one (4096 + 8192 + 40).
  o.max_bytes = 32 + 40 + 88 + kPayload + 40;
  auto t = make_file_tier(odd_layout(), o);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("max_bytes"), std::string::npos) << t.status().message();
  o.max_bytes = kAlign + kStride + 40;
  EXPECT_OK(make_file_tier(odd_layout(), o));
}

}  // namespace
}  // namespace pagedkv::testing
