// What only the file store does: its size bound, restarts, sharing a directory between live
// instances, commits by rename, cleanup of dead writers' temporaries, and its option checks.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "storage/storage_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFileBytes = 48 + 4104;  // header + payload of odd_layout()

class FileTierTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }
  std::unique_ptr<StorageTier> make(int64_t max_bytes = 0, bool fsync = false,
                                    const StorageLayout& layout = odd_layout()) {
    FileTierOptions o;
    o.directory = dir_.path();
    o.max_bytes = max_bytes;
    o.fsync = fsync;
    auto t = make_file_tier(layout, o);
    EXPECT_OK(t);
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::string store_dir() const { return dir_.path() + "/" + hex(odd_layout().fingerprint()); }
  std::string path(const StorageKey& k) const {
    return store_dir() + "/" + hex(k.block_hash).substr(14) + "/" + hex(k.ns) + "-" +
           hex(k.block_hash) + ".blk";
  }
  void put_one(StorageTier& t, const StorageKey& k, const std::vector<unsigned char>& block) {
    const StorageCompletion c = finish(t, t.submit_put({k}, {block.data()}));
    ASSERT_TRUE(c.ok) << c.error;
  }
  bool stored(StorageTier& t, const StorageKey& k) { return t.batch_exists({k}).value() == 1; }
  TempDir dir_;
};

TEST_F(FileTierTest, SizeBoundEvictsTheLeastRecentlyUsedBlock) {
  auto tier = make(/*max_bytes=*/3 * kFileBytes);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x100, 4);
  const auto blocks = random_blocks(4, 4104, 20);
  for (int i = 0; i < 3; ++i) put_one(*tier, keys[i], blocks[i]);
  auto out = poisoned(1, 4104);
  ASSERT_TRUE(finish(*tier, tier->submit_get({keys[0]}, ptrs(out))).ok);  // 0 is now recent
  put_one(*tier, keys[3], blocks[3]);  // over the bound: 1 is the least recently used
  EXPECT_FALSE(fs::exists(path(keys[1])));
  EXPECT_FALSE(stored(*tier, keys[1]));
  for (int i : {0, 2, 3}) EXPECT_TRUE(stored(*tier, keys[i])) << i;
  EXPECT_EQ(tier->stats().removed, 1);
}

TEST_F(FileTierTest, ASecondInstanceOnTheSameDirectoryFindsTheBlocks) {
  const auto keys = keys_from(0x200, 5);
  const auto blocks = random_blocks(5, 4104, 21);
  {
    auto first = make();
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(finish(*first, first->submit_put(keys, cptrs(blocks))).ok);
  }  // the first process is gone
  auto second = make();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->batch_exists(keys).value(), 5u);
  auto out = poisoned(5, 4104);
  EXPECT_TRUE(finish(*second, second->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(out, blocks);
}

TEST_F(FileTierTest, RestartRebuildsTheLruOrderFromModificationTimes) {
  const auto keys = keys_from(0x300, 4);
  const auto blocks = random_blocks(4, 4104, 22);
  {
    auto first = make();
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(finish(*first, first->submit_put(keys, cptrs(blocks))).ok);
  }
  // Oldest first: 2, 0, 3, 1.
  const int order[4] = {1, 3, 0, 2};  // seconds after the epoch base, per key
  for (int i = 0; i < 4; ++i) {
    timespec times[2] = {{1700000000 + order[i], 0}, {1700000000 + order[i], 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path(keys[i]).c_str(), times, 0), 0);
  }
  // A smaller bound than the blocks there: the two oldest go at startup.
  auto second = make(/*max_bytes=*/2 * kFileBytes + 10);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(fs::exists(path(keys[2])));
  EXPECT_FALSE(fs::exists(path(keys[0])));
  EXPECT_TRUE(stored(*second, keys[3]));
  EXPECT_TRUE(stored(*second, keys[1]));
}

TEST_F(FileTierTest, LiveInstancesSeeEachOthersBlocks) {
  auto a = make();
  auto b = make();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto keys = keys_from(0x400, 3);
  const auto blocks = random_blocks(3, 4104, 23);
  ASSERT_TRUE(finish(*a, a->submit_put(keys, cptrs(blocks))).ok);
  EXPECT_EQ(b->batch_exists(keys).value(), 3u);
  auto out = poisoned(3, 4104);
  EXPECT_TRUE(finish(*b, b->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(out, blocks);
  // A removes one; B's lookup still finds it in its own index, but its get fails (a miss) and
  // B forgets it.
  ASSERT_OK(a->remove({keys[1]}));
  a->drain();
  EXPECT_EQ(b->batch_exists(keys).value(), 3u);
  EXPECT_FALSE(finish(*b, b->submit_get({keys[1]}, {out[1].data()})).ok);
  EXPECT_EQ(b->batch_exists(keys).value(), 1u);
}

TEST_F(FileTierTest, AFailedPutLeavesNothingVisible) {
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x500, 2);
  const auto blocks = random_blocks(2, 4104, 24);
  // The block's name is taken by a non-empty directory: the commit (rename) fails.
  ASSERT_TRUE(fs::create_directories(path(keys[0]) + "/occupied"));
  const StorageCompletion c = finish(*tier, tier->submit_put(keys, cptrs(blocks)));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("rename"), std::string::npos) << c.error;
  EXPECT_EQ(tier->stats().failed_puts, 1);
  EXPECT_EQ(tier->stats().puts, 1);
  EXPECT_EQ(tier->batch_exists({keys[0]}).value(), 0u);
  EXPECT_EQ(tier->batch_exists({keys[1]}).value(), 1u);
  EXPECT_TRUE(fs::is_empty(store_dir() + "/tmp")) << "the temporary file was left behind";
}

TEST_F(FileTierTest, TemporariesOfDeadWritersAreRemovedAtStartupAndNeverRead) {
  { auto first = make(); }
  // A pid that is certainly dead: a child that has exited and been reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string dead = store_dir() + "/tmp/" + std::to_string(child) + "-0.tmp";
  const std::string alive = store_dir() + "/tmp/" + std::to_string(::getppid()) + "-0.tmp";
  std::ofstream(dead) << "half a block";
  std::ofstream(alive) << "a live writer's block";
  auto second = make();
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive)) << "a live process's temporary must stay";
  EXPECT_EQ(second->batch_exists(keys_from(0, 1)).value(), 0u);
}

TEST_F(FileTierTest, AnUnreadableFileIsDeletedAfterItsFailedGet) {
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x600, 1);
  const auto blocks = random_blocks(1, 4104, 25);
  put_one(*tier, keys[0], blocks[0]);
  fs::resize_file(path(keys[0]), 1000);
  EXPECT_TRUE(stored(*tier, keys[0]));  // the lookup trusts its index
  auto out = poisoned(1, 4104);
  EXPECT_FALSE(finish(*tier, tier->submit_get(keys, ptrs(out))).ok);
  EXPECT_FALSE(fs::exists(path(keys[0])));
  EXPECT_FALSE(stored(*tier, keys[0]));
  EXPECT_EQ(tier->stats().removed, 1);
}

TEST_F(FileTierTest, APutOfAStoredBlockWritesNothing) {
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x900, 2);
  const auto blocks = random_blocks(2, 4104, 28);
  put_one(*tier, keys[0], blocks[0]);
  struct stat before {};
  ASSERT_EQ(::stat(path(keys[0]).c_str(), &before), 0);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  struct stat after {};
  ASSERT_EQ(::stat(path(keys[0]).c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the stored file was replaced";
  EXPECT_EQ(tier->stats().puts, 3);
  EXPECT_EQ(tier->stats().bytes_written, 2 * 4104);
  // A damaged file is rewritten once a get has found (and deleted) it.
  fs::resize_file(path(keys[0]), 100);
  auto out = poisoned(1, 4104);
  EXPECT_FALSE(finish(*tier, tier->submit_get({keys[0]}, ptrs(out))).ok);
  put_one(*tier, keys[0], blocks[0]);
  EXPECT_TRUE(finish(*tier, tier->submit_get({keys[0]}, ptrs(out))).ok);
  EXPECT_EQ(out[0], blocks[0]);
}

TEST_F(FileTierTest, FsyncedPutsRoundTrip) {
  auto tier = make(0, /*fsync=*/true);
  ASSERT_NE(tier, nullptr);
  const auto keys = keys_from(0x700, 3);
  const auto blocks = random_blocks(3, 4104, 26);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  auto out = poisoned(3, 4104);
  EXPECT_TRUE(finish(*tier, tier->submit_get(keys, ptrs(out))).ok);
  EXPECT_EQ(out, blocks);
}

TEST_F(FileTierTest, ADirectoryThatWasRemovedIsMadeAgain) {
  auto tier = make();
  ASSERT_NE(tier, nullptr);
  fs::remove_all(store_dir());
  const auto keys = keys_from(0x800, 2);
  const auto blocks = random_blocks(2, 4104, 27);
  ASSERT_TRUE(finish(*tier, tier->submit_put(keys, cptrs(blocks))).ok);
  EXPECT_TRUE(fs::exists(path(keys[0])));
}

TEST_F(FileTierTest, BadOptionsAreRejected) {
  const StorageLayout l = odd_layout();
  const auto code = [&](FileTierOptions o) { return make_file_tier(l, o).status().code(); };
  FileTierOptions o;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);  // no directory
  o.directory = dir_.path();
  o.max_bytes = -1;
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.max_bytes = kFileBytes - 1;  // not even one block
  EXPECT_EQ(code(o), StatusCode::kInvalidArgument);
  o.max_bytes = 0;
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
