// What only the file store does: segments and their size bound, restarts (index rebuild, torn
// tails, removals), sharing a directory between live instances, a writer killed mid-job, a full
// disk, and its option checks.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "storage/killed_writer.hpp"
#include "storage/segment_files.hpp"
#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPayload = 4104;               // odd_layout()
constexpr int64_t kRecord = 40 + 48 + kPayload;  // record header, block header, payload
// A segment that holds two records and its seal.
constexpr int64_t kTwoRecordSegment = 32 + 2 * kRecord + 40;

class FileTierTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }
  FileTierOptions options(int32_t threads = 2) const {
    FileTierOptions o;
    o.directory = dir_.path();
    o.threads = threads;
    return o;
  }
  std::unique_ptr<StorageTier> make(const FileTierOptions& o) {
    auto t = make_file_tier(odd_layout(), o);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::unique_ptr<StorageTier> make() { return make(options()); }
  std::vector<std::string> segments() const { return segment_files(dir_.path(), odd_layout()); }
  void put(StorageTier& t, const std::vector<StorageKey>& keys,
           const std::vector<std::vector<unsigned char>>& blocks) {
    const StorageCompletion c = finish(t, t.submit_put(keys, cptrs(blocks)));
    ASSERT_TRUE(c.ok) << c.error;
  }
  bool stored(StorageTier& t, const StorageKey& k) { return t.batch_exists({k}).value() == 1; }
  // Each block read back alone: true when it read and equals `want`.
  void expect_reads(StorageTier& t, const std::vector<StorageKey>& keys,
                    const std::vector<std::vector<unsigned char>>& want) {
    auto out = poisoned(keys.size(), kPayload);
    const StorageCompletion c = finish(t, t.submit_get(keys, ptrs(out)));
    EXPECT_TRUE(c.ok) << c.error;
    EXPECT_EQ(out, want);
  }
  TempDir dir_;
};

TEST_F(FileTierTest, RoundTripAcrossSegmentsBatchSizesAndThreads) {
  for (int32_t threads : {1, 3}) {
    SCOPED_TRACE(threads);
    TempDir dir;
    FileTierOptions o = options(threads);
    o.directory = dir.path();
    o.segment_bytes = 5 * kRecord;  // four records a segment
    auto tier = make(o);
    ASSERT_NE(tier, nullptr);
    uint64_t first = 0x1000;
    for (size_t n : {1, 3, 7, 600}) {  // 600: more than one batch (512 records)
      const auto keys = keys_from(first, n);
      const auto blocks = random_blocks(n, kPayload, uint32_t(n));
      put(*tier, keys, blocks);
      EXPECT_EQ(tier->batch_exists(keys).value(), n);
      expect_reads(*tier, keys, blocks);
      first += 0x100000;
    }
    EXPECT_GT(segment_files(dir.path(), odd_layout()).size(), 150u);
  }
}

TEST_F(FileTierTest, RestartRebuildsTheIndex) {
  const auto keys = keys_from(0x200, 40);
  const auto blocks = random_blocks(40, kPayload, 21);
  {
    FileTierOptions o = options();
    o.segment_bytes = 8 * kRecord;
    auto first = make(o);
    ASSERT_NE(first, nullptr);
    put(*first, keys, blocks);
  }  // the first process is gone
  EXPECT_GE(segments().size(), 5u);
  auto second = make();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->batch_exists(keys).value(), 40u);
  expect_reads(*second, keys, blocks);
  EXPECT_EQ(second->stats().failed_gets, 0);
}

// A crash mid-append leaves the last record of the segment torn (cut short or half written) and
// no seal. Restart: that block misses, every other one reads right, new puts work.
TEST_F(FileTierTest, ATornSegmentTailIsDiscardedAtRestart) {
  struct Tear {
    const char* name;
    std::function<void(const std::string&, int64_t)> apply;  // segment path, last record offset
  };
  const std::vector<Tear> tears = {
      {"cut short", [](const std::string& p, int64_t last) { fs::resize_file(p, last + 1000); }},
      {"payload scribbled",
       [](const std::string& p, int64_t last) { write_at(p, last + 88 + 2000, "scribble"); }},
      {"header scribbled",
       [](const std::string& p, int64_t last) { write_at(p, last + 3, "\x7f"); }},
  };
  for (const Tear& tear : tears) {
    SCOPED_TRACE(tear.name);
    TempDir dir;
    FileTierOptions o = options(/*threads=*/1);
    o.directory = dir.path();
    const auto keys = keys_from(0x300, 5);
    const auto blocks = random_blocks(5, kPayload, 22);
    {
      auto tier = make(o);
      ASSERT_NE(tier, nullptr);
      put(*tier, keys, blocks);
    }
    const auto files = segment_files(dir.path(), odd_layout());
    ASSERT_EQ(files.size(), 1u);
    const std::string seg = files[0];
    const int64_t last = 32 + 4 * kRecord;
    ASSERT_EQ(int64_t(fs::file_size(seg)), last + kRecord + 40);
    fs::resize_file(seg, last + kRecord);  // no seal: its writer died
    tear.apply(seg, last);

    auto tier = make(o);
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->batch_exists(keys).value(), 4u);
    EXPECT_FALSE(stored(*tier, keys[4]));
    expect_reads(*tier, {keys.begin(), keys.begin() + 4}, {blocks.begin(), blocks.begin() + 4});
    const auto more = keys_from(0x3000, 3);
    const auto more_blocks = random_blocks(3, kPayload, 23);
    put(*tier, more, more_blocks);
    put(*tier, {keys[4]}, {blocks[4]});
    expect_reads(*tier, more, more_blocks);
    expect_reads(*tier, {keys[4]}, {blocks[4]});
  }
}

TEST_F(FileTierTest, ARemovedBlockStillMissesAfterARestart) {
  const auto keys = keys_from(0x400, 3);
  const auto blocks = random_blocks(3, kPayload, 24);
  {
    auto tier = make();
    ASSERT_NE(tier, nullptr);
    put(*tier, keys, blocks);
    ASSERT_OK(tier->remove({keys[1]}));
    tier->drain();
    EXPECT_FALSE(stored(*tier, keys[1]));
  }
  {
    auto tier = make();
    ASSERT_NE(tier, nullptr);
    EXPECT_TRUE(stored(*tier, keys[0]));
    EXPECT_FALSE(stored(*tier, keys[1]));
    EXPECT_TRUE(stored(*tier, keys[2]));
    put(*tier, {keys[1]}, {blocks[1]});  // stored again after its removal
  }
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->batch_exists(keys).value(), 3u);
  expect_reads(*tier, keys, blocks);
}

TEST_F(FileTierTest, SizeBoundDropsTheLeastRecentlyUsedSegmentWhole) {
  FileTierOptions o = options(/*threads=*/1);
  o.segment_bytes = kTwoRecordSegment;
  o.max_bytes = 4 * kTwoRecordSegment + 100;
  auto tier = make(o);
  ASSERT_NE(tier, nullptr);
  std::vector<std::vector<StorageKey>> keys;  // keys[s]: the two blocks of segment s
  std::vector<std::vector<std::vector<unsigned char>>> blocks;
  const auto put_segment = [&] {
    keys.push_back(keys_from(0x10000 * (keys.size() + 1), 2));
    blocks.push_back(random_blocks(2, kPayload, uint32_t(keys.size())));
    put(*tier, keys.back(), blocks.back());
    EXPECT_LE(segment_bytes_on_disk(dir_.path(), odd_layout()), o.max_bytes);
  };
  for (int s = 0; s < 4; ++s) put_segment();
  EXPECT_EQ(segments().size(), 4u);
  expect_reads(*tier, keys[0], blocks[0]);  // segment 0 is now the most recently used
  put_segment();                            // over the bound: segment 1 goes
  EXPECT_EQ(tier->batch_exists(keys[1]).value(), 0u);
  for (int s : {2, 3, 4, 0}) EXPECT_EQ(tier->batch_exists(keys[s]).value(), 2u) << s;
  EXPECT_EQ(tier->stats().removed, 2);
  put_segment();  // then segment 2, the least recently used now (the lookups above came later)
  EXPECT_EQ(tier->batch_exists(keys[2]).value(), 0u);
  EXPECT_EQ(tier->stats().removed, 4);
  for (int s : {0, 3, 4, 5}) expect_reads(*tier, keys[s], blocks[s]);
}

TEST_F(FileTierTest, RestartTakesTheLruOrderFromModificationTimesAndAppliesASmallerBound) {
  std::vector<std::vector<StorageKey>> keys;
  {
    FileTierOptions o = options(/*threads=*/1);
    o.segment_bytes = kTwoRecordSegment;
    auto first = make(o);
    ASSERT_NE(first, nullptr);
    for (int s = 0; s < 4; ++s) {
      keys.push_back(keys_from(0x10000 * (s + 1), 2));
      put(*first, keys.back(), random_blocks(2, kPayload, uint32_t(s)));
    }
  }
  const auto files = segments();
  ASSERT_EQ(files.size(), 4u);
  // Oldest first: 2, 0, 3, 1.
  const int order[4] = {1, 3, 0, 2};  // seconds after the epoch base, per segment
  for (int s = 0; s < 4; ++s) {
    timespec times[2] = {{1700000000 + order[s], 0}, {1700000000 + order[s], 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, files[size_t(s)].c_str(), times, 0), 0);
  }
  FileTierOptions o = options();
  o.max_bytes = 2 * kTwoRecordSegment + 10;  // the two oldest go at startup
  auto second = make(o);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(fs::exists(files[2]));
  EXPECT_FALSE(fs::exists(files[0]));
  EXPECT_EQ(second->batch_exists(keys[3]).value(), 2u);
  EXPECT_EQ(second->batch_exists(keys[1]).value(), 2u);
  EXPECT_EQ(second->batch_exists(keys[0]).value(), 0u);
  EXPECT_EQ(second->stats().removed, 4);
}

// A segment whose blocks were all removed is deleted at once, its file reused for the next
// segment (its pages are in the page cache already). Records of the file's earlier life, past
// the new segment's end, never read back, even after a crash left the new one unsealed.
TEST_F(FileTierTest, ADeadSegmentsFileIsReusedAndItsOldRecordsNeverReadAgain) {
  FileTierOptions o = options(/*threads=*/1);
  o.segment_bytes = kTwoRecordSegment;
  const auto a = keys_from(0x10000, 2), b = keys_from(0x20000, 2), c = keys_from(0x30000, 1);
  const auto a_blocks = random_blocks(2, kPayload, 40), b_blocks = random_blocks(2, kPayload, 41);
  const auto c_blocks = random_blocks(1, kPayload, 42);
  std::string unsealed;  // the reused segment as a crash would have left it
  std::string reused;
  {
    auto tier = make(o);
    ASSERT_NE(tier, nullptr);
    put(*tier, a, a_blocks);
    put(*tier, b, b_blocks);  // a's segment is sealed
    const std::string first = segments().front();
    struct stat before {};
    ASSERT_EQ(::stat(first.c_str(), &before), 0);
    ASSERT_OK(tier->remove(a));
    tier->drain();
    EXPECT_FALSE(fs::exists(first)) << "a segment with no live block is deleted";
    put(*tier, c, c_blocks);  // b's segment is sealed; c goes to a new one in a's old file
    const auto files = segments();
    ASSERT_EQ(files.size(), 2u);
    reused = files.back();
    struct stat after {};
    ASSERT_EQ(::stat(reused.c_str(), &after), 0);
    EXPECT_EQ(after.st_ino, before.st_ino) << "the dead segment's file was not reused";
    EXPECT_EQ(int64_t(after.st_size), kTwoRecordSegment) << "it keeps its old length";
    unsealed = file_bytes(reused);
    expect_reads(*tier, c, c_blocks);
  }
  EXPECT_EQ(int64_t(fs::file_size(reused)), 32 + kRecord + 40) << "sealed and cut after the seal";
  std::ofstream(reused, std::ios::binary | std::ios::trunc) << unsealed;  // the crash
  auto tier = make(o);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->batch_exists({a[0]}).value(), 0u);
  EXPECT_EQ(tier->batch_exists({a[1]}).value(), 0u) << "a record of the file's earlier life";
  expect_reads(*tier, b, b_blocks);
  expect_reads(*tier, c, c_blocks);
}

TEST_F(FileTierTest, LiveInstancesSeeEachOthersBlocks) {
  auto a = make();
  auto b = make();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto keys = keys_from(0x500, 3);
  const auto blocks = random_blocks(3, kPayload, 25);
  put(*a, keys, blocks);
  EXPECT_EQ(b->batch_exists(keys).value(), 3u);
  expect_reads(*b, keys, blocks);
  // A removes one; B's lookup still finds it in its own index, but its get fails (a miss) and
  // B forgets it.
  ASSERT_OK(a->remove({keys[1]}));
  a->drain();
  EXPECT_EQ(b->batch_exists(keys).value(), 3u);
  auto out = poisoned(1, kPayload);
  EXPECT_FALSE(finish(*b, b->submit_get({keys[1]}, ptrs(out))).ok);
  EXPECT_EQ(b->batch_exists(keys).value(), 1u);
  // More blocks appended to A's segment are found too.
  const auto more = keys_from(0x5000, 2);
  const auto more_blocks = random_blocks(2, kPayload, 26);
  put(*a, more, more_blocks);
  EXPECT_EQ(b->batch_exists(more).value(), 2u);
  expect_reads(*b, more, more_blocks);
}

// Gets of blocks whose put is still running either miss or read the whole verified block.
TEST_F(FileTierTest, AGetRacingItsPutMissesOrReadsTheWholeBlock) {
  auto tier = make(options(/*threads=*/3));
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x600, 64);
  const auto blocks = random_blocks(64, kPayload, 27);
  // One destination per get: gets of one key run at once on different threads.
  std::vector<std::vector<std::vector<unsigned char>>> outs;
  const auto src = cptrs(blocks);
  std::vector<uint64_t> jobs;
  for (size_t i = 0; i < keys.size(); i += 16) {
    jobs.push_back(tier->submit_put({keys.begin() + long(i), keys.begin() + long(i + 16)},
                                    {src.begin() + long(i), src.begin() + long(i + 16)})
                       .value());
    outs.push_back(poisoned(64, kPayload));
    for (size_t j = 0; j < keys.size(); ++j) {
      jobs.push_back(tier->submit_get({keys[j]}, {outs.back()[j].data()}).value());
    }
  }
  std::map<uint64_t, size_t> get_of;  // job id -> its get's index (round * 64 + block)
  for (size_t n = 0, k = 0; n < jobs.size(); ++n) {
    if (n % 65 == 0) continue;  // the put
    get_of[jobs[n]] = k++;
  }
  tier->drain();
  for (const auto& [id, c] : collect(*tier, jobs)) {
    if (get_of.count(id) == 0) {
      EXPECT_TRUE(c.ok) << c.error;
    } else if (c.ok) {
      const size_t round = get_of[id] / keys.size(), block = get_of[id] % keys.size();
      EXPECT_EQ(outs[round][block], blocks[block]);
    } else {
      EXPECT_NE(c.error.find("not stored"), std::string::npos) << c.error;
    }
  }
  expect_reads(*tier, keys, blocks);
}

TEST_F(FileTierTest, AnUnreadableBlockIsDroppedAfterItsFailedGetAndStaysDropped) {
  const auto keys = keys_from(0x700, 3);
  const auto blocks = random_blocks(3, kPayload, 28);
  {
    auto tier = make(options(/*threads=*/1));
    ASSERT_NE(tier, nullptr);
    put(*tier, keys, blocks);
    const auto r = block_record(dir_.path(), odd_layout(), keys[1]);
    ASSERT_TRUE(r.has_value());
    write_at(r->path, r->offset + 88 + 7, "bitrot");
    EXPECT_TRUE(stored(*tier, keys[1]));  // the lookup trusts its index
    auto out = poisoned(1, kPayload);
    const StorageCompletion c = finish(*tier, tier->submit_get({keys[1]}, ptrs(out)));
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.error.find("payload checksum"), std::string::npos) << c.error;
    EXPECT_FALSE(stored(*tier, keys[1]));
    EXPECT_EQ(tier->stats().removed, 1);
  }
  auto tier = make();  // the sealed segment's headers are trusted; the record says removed
  ASSERT_NE(tier, nullptr);
  EXPECT_FALSE(stored(*tier, keys[1]));
  expect_reads(*tier, {keys[0], keys[2]}, {blocks[0], blocks[2]});
}

TEST_F(FileTierTest, APutOfAStoredBlockWritesNothing) {
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x900, 2);
  const auto blocks = random_blocks(2, kPayload, 29);
  put(*tier, {keys[0]}, {blocks[0]});
  const size_t records = all_records(dir_.path(), odd_layout()).size();
  put(*tier, keys, blocks);
  EXPECT_EQ(all_records(dir_.path(), odd_layout()).size(), records + 1);
  EXPECT_EQ(tier->stats().puts, 3);
  EXPECT_EQ(tier->stats().bytes_written, 2 * kPayload);
  // A damaged block is written again once a get has found (and dropped) it.
  const auto r = block_record(dir_.path(), odd_layout(), keys[0]);
  ASSERT_TRUE(r.has_value());
  write_at(r->path, r->offset + 100, "x");
  auto out = poisoned(1, kPayload);
  EXPECT_FALSE(finish(*tier, tier->submit_get({keys[0]}, ptrs(out))).ok);
  put(*tier, {keys[0]}, {blocks[0]});
  expect_reads(*tier, {keys[0]}, {blocks[0]});
}

TEST_F(FileTierTest, FsyncedPutsRoundTrip) {
  FileTierOptions o = options();
  o.fsync = true;
  auto tier = make(o);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0xa00, 3);
  const auto blocks = random_blocks(3, kPayload, 30);
  put(*tier, keys, blocks);
  ASSERT_OK(tier->remove({keys[0]}));
  tier->drain();
  expect_reads(*tier, {keys[1], keys[2]}, {blocks[1], blocks[2]});
}

TEST_F(FileTierTest, ADirectoryThatWasRemovedIsMadeAgain) {
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  fs::remove_all(dir_.path() + "/" + hex(odd_layout().fingerprint()));
  const auto keys = keys_from(0xb00, 2);
  put(*tier, keys, random_blocks(2, kPayload, 31));
  EXPECT_FALSE(segments().empty());
}

// kill -9 of a writer mid-job, then a restart: every block that reads back reads right, every
// job the writer reported finished reads back whole, and the store takes new puts.
TEST_F(FileTierTest, AWriterKilledMidJobLeavesOnlyVerifiedBlocks) {
  FileTierOptions o = options();
  o.segment_bytes = 16 * kRecord;
  kill_writer_mid_job_and_restart(o, kPayload, 0x10000000ull, 1000);
}

// A full disk (RLIMIT_FSIZE in a child, SIGXFSZ ignored): puts fail and are counted, earlier
// blocks still read right, nothing crashes. The child reports by its exit code.
TEST_F(FileTierTest, AFullDiskFailsPutsAndKeepsEarlierBlocks) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{32 + 6 * kRecord + 40, 32 + 6 * kRecord + 40};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    FileTierOptions o = options(/*threads=*/1);
    auto made = make_file_tier(odd_layout(), o);
    if (!made.ok()) ::_exit(3);
    std::unique_ptr<StorageTier> tier = std::move(made).value();
    const auto run = [&](StatusOr<uint64_t> job) {
      if (!job.ok()) ::_exit(4);
      tier->drain();
      auto done = tier->poll();
      return done.size() == 1 && done[0].ok;
    };
    const auto early = keys_from(0xd00, 4);
    const auto early_blocks = random_blocks(4, kPayload, 33);
    if (!run(tier->submit_put(early, cptrs(early_blocks)))) ::_exit(5);
    const auto late = keys_from(0xe00, 8);
    const auto late_blocks = random_blocks(8, kPayload, 34);
    if (run(tier->submit_put(late, cptrs(late_blocks)))) ::_exit(6);  // past the limit
    if (tier->stats().failed_puts != 8) ::_exit(7);
    if (tier->batch_exists(late).value() != 0) ::_exit(8);
    auto out = poisoned(4, kPayload);
    if (!run(tier->submit_get(early, ptrs(out))) || out != early_blocks) ::_exit(9);
    if (tier->batch_exists(early).value() != 4) ::_exit(10);
    tier.reset();  // seals what fits
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child crashed (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The early blocks survive the child, the failed ones were never stored.
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->batch_exists(keys_from(0xd00, 4)).value(), 4u);
  expect_reads(*tier, keys_from(0xd00, 4), random_blocks(4, kPayload, 33));
  EXPECT_EQ(tier->batch_exists(keys_from(0xe00, 1)).value(), 0u);
}

TEST_F(FileTierTest, SegmentsOfAnotherLayoutOrGarbageAreNeverRead) {
  const auto keys = keys_from(0xf00, 2);
  const auto blocks = random_blocks(2, kPayload, 35);
  {
    auto tier = make();
    ASSERT_NE(tier, nullptr);
    put(*tier, keys, blocks);
  }
  // A segment with a bad header in the store's directory is ignored.
  std::ofstream(dir_.path() + "/" + hex(odd_layout().fingerprint()) + "/00000000000000ff.seg")
      << "not a segment at all, but long enough to look like one......";
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  expect_reads(*tier, keys, blocks);
  auto other = make_file_tier(odd_layout("another-model"), options());
  ASSERT_OK(other);
  EXPECT_EQ(other.value()->batch_exists(keys).value(), 0u);
}

TEST_F(FileTierTest, BadOptionsAreRejected) {
  const StorageLayout l = odd_layout();
  const auto code = [&](FileTierOptions o) { return make_file_tier(l, o).status().code(); };
  FileTierOptions o;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);  // no directory
  o.directory = dir_.path();
  o.max_bytes = -1;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.max_bytes = 32 + 40 + kRecord - 1;  // not even one segment of one block and its seal
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.max_bytes = 0;
  o.segment_bytes = 0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.segment_bytes = 1;  // a segment always takes one block
  EXPECT_EQ(code(o), StatusCode::kOk);
  o.threads = 0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.threads = 2;
  o.max_queued_blocks = 0;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.max_queued_blocks = 16;
  // A file where the directory should be.
  std::ofstream(dir_.path() + "/a-file") << "x";
  o.directory = dir_.path() + "/a-file/store";
  EXPECT_EQ(code(o), StatusCode::kUnavailable);
  o.directory = dir_.path() + "/new/nested";
  EXPECT_EQ(code(o), StatusCode::kOk);
  EXPECT_STREQ(make_file_tier(l, o).value()->medium(), "DISK");
}

}  // namespace
}  // namespace pagedkv::testing
