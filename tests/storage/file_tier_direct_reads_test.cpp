// The file store's reads around the page cache (FileTierOptions::direct_read_depth): DirectReads
// on odd spans and the end of a file, with io_uring and one read at a time; gets of packed and
// aligned records of odd sizes bit-exact through it; a damaged payload and a truncated segment
// fail only their blocks; depth 0 and the page-cache check (cachestat) decide which path a get
// takes; bad options are refused. Version 3 records (payloads of whole pages) read in place into
// page-aligned destinations: bit-exact, counted, damage and truncation caught as above.
#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "storage/direct_reads.hpp"
#include "storage/file_tier.hpp"
#include "storage/segment_files.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

namespace fs = std::filesystem;

// Resets the test seams whatever a test does.
class SeamGuard {
 public:
  SeamGuard(bool force_direct, bool refuse_ring) {
    detail::force_direct_reads_for_testing(force_direct);
    detail::refuse_io_uring_for_testing(refuse_ring);
  }
  ~SeamGuard() {
    detail::force_direct_reads_for_testing(false);
    detail::refuse_io_uring_for_testing(false);
  }
};

bool on_tmpfs(const std::string& path) {
  struct statfs st {};
  return ::statfs(path.c_str(), &st) == 0 && st.f_type == 0x01021994;  // TMPFS_MAGIC
}

// A file of random bytes whose size is not a multiple of the page; reads of aligned spans
// (some past its end) come back equal to the bytes there, in any order of completion.
TEST(DirectReadsTest, AlignedSpansReadBackEqualUpToTheEndOfTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/data";
  const int64_t size = (int64_t{1} << 20) + 1234;
  std::string bytes(static_cast<size_t>(size), '\0');
  std::mt19937 rng(17);
  for (char& c : bytes) c = static_cast<char>(rng());
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
  for (const bool refuse : {false, true}) {
    SCOPED_TRACE(refuse ? "one at a time" : "io_uring where the kernel allows");
    SeamGuard seams(false, refuse);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) {
      GTEST_SKIP() << "O_DIRECT refused here";
    }
    std::vector<detail::DirectReads::Read> reads;
    for (size_t t = 0; t < 23; ++t) {
      const int64_t offset = static_cast<int64_t>((t * 37) % 260) * 4096;
      const int64_t span = static_cast<int64_t>(1 + t % 5) * 4096 * (t % 3 == 0 ? 16 : 1);
      reads.push_back({fd, offset, span, t});
    }
    reads.push_back({fd, size / 4096 * 4096, 8192, 23});         // the last page: short
    reads.push_back({fd, size / 4096 * 4096 + 4096, 4096, 24});  // past the end: nothing
    detail::DirectReads reader(4);
    std::vector<int> seen(reads.size(), 0);
    ASSERT_TRUE(reader.run(reads, [&](size_t tag, const unsigned char* data, int64_t got, int err) {
      ASSERT_LT(tag, reads.size());
      ++seen[tag];
      EXPECT_EQ(err, 0);
      const auto& r = reads[tag];
      const int64_t want = std::max<int64_t>(0, std::min(r.bytes, size - r.offset));
      ASSERT_EQ(got, want) << "read " << tag;
      EXPECT_EQ(std::memcmp(data, bytes.data() + r.offset, static_cast<size_t>(got)), 0)
          << "read " << tag;
    }));
    EXPECT_EQ(seen, std::vector<int>(reads.size(), 1));
    if (refuse) {
      EXPECT_FALSE(reader.uses_io_uring());
    }
    ::close(fd);
  }
}

class FileTierDirectReadsTest : public ::testing::Test {
 protected:
  FileTierOptions options(bool direct_io, int32_t depth = 3) const {
    FileTierOptions o;
    o.directory = dir_.path();
    o.threads = 2;
    o.direct_io = direct_io;
    o.direct_read_depth = depth;
    o.segment_bytes = 96 << 10;  // several segments
    return o;
  }
  std::unique_ptr<StorageTier> make(const FileTierOptions& o, const StorageLayout& layout) {
    auto t = make_file_tier(layout, o);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  }
  static void put(StorageTier& t, const std::vector<StorageKey>& keys,
                  const std::vector<std::vector<unsigned char>>& blocks) {
    for (size_t begin = 0; begin < keys.size(); begin += 10) {  // jobs of 10
      const size_t end = std::min(keys.size(), begin + 10);
      const std::vector<StorageKey> k(keys.begin() + long(begin), keys.begin() + long(end));
      const std::vector<std::vector<unsigned char>> b(blocks.begin() + long(begin),
                                                      blocks.begin() + long(end));
      const StorageCompletion c = finish(t, t.submit_put(k, cptrs(b)));
      ASSERT_TRUE(c.ok) << c.error;
    }
  }
  // Gets `keys` in one job into poisoned buffers; returns them.
  static std::vector<std::vector<unsigned char>> get(StorageTier& t,
                                                     const std::vector<StorageKey>& keys,
                                                     int64_t bytes, StorageCompletion* c) {
    auto out = poisoned(keys.size(), bytes);
    *c = finish(t, t.submit_get(keys, ptrs(out)));
    return out;
  }
  TempDir dir_;
};

// Packed records (written through the page cache) and aligned ones (O_DIRECT appends), of sizes
// below, at and above a page, read around the page cache in a shuffled job that spans segments
// and both threads: every byte equal, every block counted as read directly; again with one read
// at a time.
TEST_F(FileTierDirectReadsTest, ColdRunsOfPackedAndAlignedRecordsReadBackBitExact) {
  const std::vector<StorageLayout> layouts = {odd_layout(), StorageLayout::opaque(3001, "dr:odd"),
                                              StorageLayout::opaque(4096, "dr:page"),
                                              StorageLayout::opaque(20000, "dr:large")};
  for (const bool refuse_ring : {false, true}) {
    for (const bool direct_io : {false, true}) {
      for (const StorageLayout& layout : layouts) {
        SCOPED_TRACE(std::to_string(layout.block_bytes) + " bytes, direct_io " +
                     std::to_string(direct_io) + ", io_uring refused " +
                     std::to_string(refuse_ring));
        SeamGuard seams(/*force_direct=*/true, refuse_ring);
        TempDir sub;
        FileTierOptions o = options(direct_io);
        o.directory = sub.path();
        auto tier = make(o, layout);
        ASSERT_NE(tier, nullptr);
        const size_t n = 41;
        const auto keys = keys_from(0x5eed + uint64_t(layout.block_bytes), n);
        const auto blocks = random_blocks(n, layout.block_bytes, uint32_t(layout.block_bytes + n));
        put(*tier, keys, blocks);
        std::vector<size_t> order(n);
        for (size_t i = 0; i < n; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), std::mt19937(5));
        std::vector<StorageKey> shuffled;
        std::vector<std::vector<unsigned char>> want;
        for (size_t i : order) {
          shuffled.push_back(keys[i]);
          want.push_back(blocks[i]);
        }
        StorageCompletion c;
        EXPECT_EQ(get(*tier, shuffled, layout.block_bytes, &c), want);
        EXPECT_TRUE(c.ok) << c.error;
        const StorageStats s = tier->stats();
        EXPECT_EQ(s.gets, int64_t(n));
        EXPECT_EQ(s.gets_direct, int64_t(n));
        EXPECT_EQ(s.failed_gets, 0);
      }
    }
  }
}

// A payload damaged on disk fails its own block's get (checksum) and nothing else's, read
// around the page cache as through it; the block is forgotten (the next get misses it).
TEST_F(FileTierDirectReadsTest, ADamagedPayloadFailsOnlyItsBlock) {
  SeamGuard seams(/*force_direct=*/true, false);
  const StorageLayout layout = odd_layout();
  auto tier = make(options(/*direct_io=*/false), layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xbad, 12);
  const auto blocks = random_blocks(12, layout.block_bytes, 3);
  put(*tier, keys, blocks);
  const auto r = block_record(dir_.path(), layout, keys[5]);
  ASSERT_TRUE(r.has_value());
  write_at(r->path, r->offset + 88 + 1001, "rot");
  auto out = poisoned(keys.size(), layout.block_bytes);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("checksum"), std::string::npos) << c.error;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i != 5) {
      EXPECT_EQ(out[i], blocks[i]) << "block " << i;
    }
  }
  const StorageStats s = tier->stats();
  EXPECT_EQ(s.failed_gets, 1);
  EXPECT_EQ(s.gets_direct, 11);
  EXPECT_EQ(tier->batch_exists({keys[5]}).value(), 0u);
}

// A segment cut short in its last record: that record reads as truncated, the others of the
// same segment read back whole.
TEST_F(FileTierDirectReadsTest, ARecordPastATruncatedSegmentEndFailsAsTruncated) {
  SeamGuard seams(/*force_direct=*/true, false);
  const StorageLayout layout = odd_layout();
  FileTierOptions o = options(/*direct_io=*/true);
  o.threads = 1;
  o.segment_bytes = 64 << 20;  // one segment
  auto tier = make(o, layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x7a11, 6);
  const auto blocks = random_blocks(6, layout.block_bytes, 9);
  put(*tier, keys, blocks);
  const auto last = block_record(dir_.path(), layout, keys[5]);
  ASSERT_TRUE(last.has_value());
  fs::resize_file(last->path, static_cast<uintmax_t>(last->offset + 88 + 100));
  auto out = poisoned(keys.size(), layout.block_bytes);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, ptrs(out)));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("truncated"), std::string::npos) << c.error;
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out[i], blocks[i]) << "block " << i;
  EXPECT_EQ(tier->stats().gets_direct, 5);
}

// Page-aligned destinations, each `bytes` long, `misalign` bytes past a page boundary (0: on
// one), filled with 0xA5.
class Destinations {
 public:
  Destinations(size_t n, int64_t bytes, size_t misalign) : bytes_(size_t(bytes)) {
    for (size_t i = 0; i < n; ++i) {
      void* p = nullptr;
      EXPECT_EQ(::posix_memalign(&p, 4096, bytes_ + 4096), 0);
      std::memset(p, 0xA5, bytes_ + 4096);
      mem_.emplace_back(static_cast<unsigned char*>(p));
      ptrs_.push_back(mem_.back().get() + misalign);
    }
  }
  const std::vector<void*>& ptrs() const { return ptrs_; }
  std::vector<std::vector<unsigned char>> contents() const {
    std::vector<std::vector<unsigned char>> out;
    for (void* p : ptrs_) {
      auto* c = static_cast<unsigned char*>(p);
      out.emplace_back(c, c + bytes_);
    }
    return out;
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  size_t bytes_;
  std::vector<std::unique_ptr<unsigned char, Free>> mem_;
  std::vector<void*> ptrs_;
};

// Blocks of whole pages written as version 3: with direct_io at any size, and with reads around
// the page cache alone from 64 KiB (buffered appends of page-aligned payloads); smaller ones
// without direct_io stay packed. A shuffled cold get across segments and threads into
// page-aligned destinations reads every version 3 block in place; into destinations off the page
// boundary, through the aligned spans and a copy; bit-exact both ways, through io_uring and one
// read at a time, and again after a restart (the index rebuilt from the segments).
TEST_F(FileTierDirectReadsTest, PayloadsOfWholePagesReadInPlaceIntoAlignedDestinations) {
  struct Case {
    int64_t bytes;
    bool direct_io;
    int version;  // of the segments written
  };
  const std::vector<Case> cases = {{4096, true, 3},   {12288, true, 3},  {65536, true, 3},
                                   {65536, false, 3}, {73728, false, 3}, {32768, false, 1}};
  for (const bool refuse_ring : {false, true}) {
    for (const Case& k : cases) {
      SCOPED_TRACE(std::to_string(k.bytes) + " bytes, direct_io " + std::to_string(k.direct_io) +
                   ", io_uring refused " + std::to_string(refuse_ring));
      SeamGuard seams(/*force_direct=*/true, refuse_ring);
      TempDir sub;
      FileTierOptions o = options(k.direct_io);
      o.directory = sub.path();
      o.segment_bytes = 512 << 10;
      const StorageLayout layout = StorageLayout::opaque(k.bytes, "dr:in-place");
      auto tier = make(o, layout);
      ASSERT_NE(tier, nullptr);
      const size_t n = 29;
      const auto keys = keys_from(0x1a9e + uint64_t(k.bytes), n);
      const auto blocks = random_blocks(n, k.bytes, uint32_t(k.bytes) + 1);
      put(*tier, keys, blocks);
      for (const std::string& f : segment_files(sub.path(), layout)) {
        EXPECT_EQ(segment_format(file_bytes(f)).version, k.version) << f;
      }
      std::vector<size_t> order(n);
      for (size_t i = 0; i < n; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937(11));
      std::vector<StorageKey> shuffled;
      std::vector<std::vector<unsigned char>> want;
      for (size_t i : order) {
        shuffled.push_back(keys[i]);
        want.push_back(blocks[i]);
      }
      const int64_t in_place = k.version == 3 ? int64_t(n) : 0;
      for (const bool restarted : {false, true}) {
        if (restarted) {
          tier.reset();
          tier = make(o, layout);
          ASSERT_NE(tier, nullptr);
        }
        Destinations aligned(n, k.bytes, 0);
        StorageCompletion c = finish(*tier, tier->submit_get(shuffled, aligned.ptrs()));
        EXPECT_TRUE(c.ok) << c.error;
        EXPECT_EQ(aligned.contents(), want);
        StorageStats s = tier->stats();
        EXPECT_EQ(s.gets_direct, int64_t(n));
        EXPECT_EQ(s.gets_in_place, in_place);
        Destinations off_page(n, k.bytes, 16);
        c = finish(*tier, tier->submit_get(shuffled, off_page.ptrs()));
        EXPECT_TRUE(c.ok) << c.error;
        EXPECT_EQ(off_page.contents(), want);
        s = tier->stats();
        EXPECT_EQ(s.gets_direct, int64_t(2 * n));
        EXPECT_EQ(s.gets_in_place, in_place);  // none more
        EXPECT_EQ(s.failed_gets, 0);
      }
    }
  }
}

// Read in place, a payload damaged on disk fails its own block (checksum) and is forgotten; a
// segment cut inside its last payload fails that block as truncated; the others read back whole.
TEST_F(FileTierDirectReadsTest, InPlaceReadsCatchDamageAndTruncation) {
  SeamGuard seams(/*force_direct=*/true, false);
  const StorageLayout layout = StorageLayout::opaque(8192, "dr:in-place-damage");
  FileTierOptions o = options(/*direct_io=*/true);
  o.threads = 1;
  o.segment_bytes = 64 << 20;  // one segment
  auto tier = make(o, layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xd0d0, 9);
  const auto blocks = random_blocks(9, layout.block_bytes, 12);
  put(*tier, keys, blocks);
  const auto damaged = block_record(dir_.path(), layout, keys[3]);
  const auto last = block_record(dir_.path(), layout, keys[8]);
  ASSERT_TRUE(damaged.has_value() && last.has_value());
  write_at(damaged->path, damaged->offset + 4096 + 777, "rot");
  fs::resize_file(last->path, static_cast<uintmax_t>(last->offset + 4096 + 5000));
  Destinations out(keys.size(), layout.block_bytes, 0);
  const StorageCompletion c = finish(*tier, tier->submit_get(keys, out.ptrs()));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("checksum"), std::string::npos) << c.error;
  const auto got = out.contents();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i != 3 && i != 8) {
      EXPECT_EQ(got[i], blocks[i]) << "block " << i;
    }
  }
  const StorageStats s = tier->stats();
  EXPECT_EQ(s.failed_gets, 2);
  EXPECT_EQ(s.gets_in_place, 7);
  EXPECT_EQ(tier->exists_each({keys[3], keys[8], keys[4]}).value(),
            (std::vector<bool>{false, false, true}));
}

// direct_read_depth 0 reads everything through the page cache, even where it holds nothing.
TEST_F(FileTierDirectReadsTest, DepthZeroReadsEverythingThroughThePageCache) {
  SeamGuard seams(/*force_direct=*/true, false);
  const StorageLayout layout = odd_layout();
  auto tier = make(options(/*direct_io=*/true, /*depth=*/0), layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x0, 15);
  const auto blocks = random_blocks(15, layout.block_bytes, 4);
  put(*tier, keys, blocks);
  StorageCompletion c;
  EXPECT_EQ(get(*tier, keys, layout.block_bytes, &c), blocks);
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(tier->stats().gets_direct, 0);
}

// Without the seam the page cache decides: blocks appended with O_DIRECT are not in it, so a
// get reads them around it; once the segments have been read through the page cache, a get
// reads them from there.
TEST_F(FileTierDirectReadsTest, ThePageCacheDecidesWhichBlocksAreReadDirectly) {
  if (on_tmpfs(dir_.path())) {
    GTEST_SKIP() << "tmpfs: every page is in the page cache";
  }
  const StorageLayout layout = StorageLayout::opaque(20000, "dr:cache");
  auto tier = make(options(/*direct_io=*/true), layout);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xcace, 20);
  const auto blocks = random_blocks(20, layout.block_bytes, 6);
  put(*tier, keys, blocks);
  const auto files = segment_files(dir_.path(), layout);
  ASSERT_FALSE(files.empty());
  {
    const int fd = ::open(files[0].c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const auto state = detail::page_cache_state(fd, 4096, 4096);
    ::close(fd);
    if (state == detail::PageCacheState::kUnknown) {
      GTEST_SKIP() << "no cachestat on this kernel";
    }
    if (state == detail::PageCacheState::kCached) {
      GTEST_SKIP() << "O_DIRECT appends were cached";
    }
  }
  StorageCompletion c;
  EXPECT_EQ(get(*tier, keys, layout.block_bytes, &c), blocks);
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(tier->stats().gets_direct, 20);
  for (const std::string& f : files) (void)file_bytes(f);  // through the page cache
  EXPECT_EQ(get(*tier, keys, layout.block_bytes, &c), blocks);
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(tier->stats().gets_direct, 20);  // none more
  EXPECT_EQ(tier->stats().gets, 40);
}

TEST_F(FileTierDirectReadsTest, ADepthOutsideZeroTo256IsRefused) {
  for (const int32_t depth : {-1, 257}) {
    FileTierOptions o = options(false, depth);
    auto t = make_file_tier(odd_layout(), o);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("direct_read_depth"), std::string::npos);
  }
}

}  // namespace
}  // namespace pagedkv::testing
