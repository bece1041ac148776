// A KvCache with a storage tier behind its host tier (KvCacheOptions::storage), end to end on
// real bytes and a real FileTier directory: cached host blocks the host LRU drops are written
// back; a second cache on the same directory (a restart) fetches a prompt's blocks into its host
// tier, a sequence added afterwards hits them and reads back exactly the bytes the first cache's
// model wrote; a corrupt block file is a miss, never garbage; a full write-back queue drops
// blocks and counts them; a store of another layout is refused. check_invariants() after every
// step.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/kv_model.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

namespace fs = std::filesystem;
using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

// 4 device blocks and 4 host blocks of 4 tokens: a few 2-block prompts push cached blocks
// through the host tier into storage.
CacheConfig small_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 4;
  c.num_device_blocks = 4;
  c.num_host_blocks = 4;
  c.backend = BackendKind::kCpu;
  return c;
}

// Prompt p: 9 tokens (two full blocks and one token to compute), distinct per p.
std::vector<TokenId> prompt(int p) {
  std::vector<TokenId> t;
  for (int i = 0; i < 9; ++i) t.push_back(1000 * (p + 1) + i);
  return t;
}

class StorageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pagedkv-storage-cache-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    backend_ = create_cpu_backend({});
  }
  void TearDown() override {
    cache_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A fresh store on the directory (a new process would open it the same way) and a cache.
  void open(const CacheConfig& c, int64_t staging = 64, int64_t max_bytes = 0) {
    cache_.reset();
    store_.reset();
    config_ = c;
    FileTierOptions fo;
    fo.directory = dir_;
    fo.max_bytes = max_bytes;
    auto store = make_file_tier(StorageLayout::from_config(c, "test-model"), fo);
    ASSERT_OK(store);
    store_ = std::move(store).value();
    KvCacheOptions o;
    o.backend = faults_ != nullptr ? static_cast<Backend*>(faults_.get()) : backend_.get();
    o.storage = store_.get();
    o.storage_staging_blocks = staging;
    auto cache = KvCache::create(c, o);
    ASSERT_OK(cache);
    cache_ = std::move(cache).value();
  }

  void expect_invariants() {
    const Status s = cache_->check_invariants();
    ASSERT_OK(s);
  }

  // Adds a sequence, writes the model's K/V of its uncached tokens, commits, finishes it (its
  // full blocks stay cached).
  void compute_and_finish(SequenceId id, const std::vector<TokenId>& tokens) {
    compute(id, tokens, /*finish=*/true);
  }

  // As compute_and_finish(); without `finish` the sequence stays, inactive (a victim the planner
  // may offload).
  void compute(SequenceId id, const std::vector<TokenId>& tokens, bool finish) {
    auto cached = cache_->add_sequence(id, tokens);
    ASSERT_OK(cached);
    const std::vector<TokenId> rest(tokens.begin() + *cached, tokens.end());
    ASSERT_OK(cache_->reserve(id, static_cast<int64_t>(rest.size())));
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<uint16_t> k = model_rows(config_, layer, 0, rest, *cached);
      const std::vector<uint16_t> v = model_rows(config_, layer, 1, rest, *cached);
      DeviceBuffer dk(*backend_, k.size() * 2), dv(*backend_, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      ASSERT_OK(cache_->write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16));
      ASSERT_OK(cache_->synchronize());
    }
    ASSERT_OK(cache_->commit(id, rest));
    if (finish) {
      ASSERT_OK(cache_->finish(id));
    }
    expect_invariants();
  }

  // Every layer of the first `n` positions of `id` equals the model of `tokens`.
  void expect_model_bytes(SequenceId id, const std::vector<TokenId>& tokens, int64_t n) {
    const size_t elems = static_cast<size_t>(n * config_.num_kv_heads * config_.head_dim);
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      DeviceBuffer k(*backend_, elems * 2), v(*backend_, elems * 2);
      ASSERT_OK(cache_->gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                     PackedLayout::kHeadMajor, 0, n));
      ASSERT_OK(cache_->synchronize());
      const std::vector<uint16_t> got[2] = {k.download<uint16_t>(), v.download<uint16_t>()};
      for (int32_t part = 0; part < 2; ++part)
        for (int32_t h = 0; h < config_.num_kv_heads; ++h)
          for (int64_t t = 0; t < n; ++t)
            for (int32_t d = 0; d < config_.head_dim; ++d) {
              const size_t i = static_cast<size_t>((h * n + t) * config_.head_dim + d);
              ASSERT_EQ(got[part][i],
                        kv_value(t, tokens[static_cast<size_t>(t)], layer, part, h, d))
                  << "seq " << id << " layer " << layer << " part " << part << " pos " << t;
            }
    }
  }

  // Flips one byte in the middle of the payload of every stored block whose hash, in hex,
  // contains `name` (every one for ""); returns how many. The blocks are records in the file
  // store's segments (docs/storage.md): a 32-byte segment header, then records of a 40-byte
  // header (type at 4, hash at 16, body bytes at 24) and the body (48-byte header, payload).
  int corrupt_files(const std::string& name) {
    int corrupted = 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      if (!entry.is_regular_file() || entry.path().extension() != ".seg") continue;
      std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
      const auto size = static_cast<std::streamoff>(entry.file_size());
      for (std::streamoff off = 32; off + 40 <= size;) {
        unsigned char head[40];
        f.seekg(off);
        f.read(reinterpret_cast<char*>(head), 40);
        const auto le = [&](int at, int bytes) {
          uint64_t v = 0;
          for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | head[at + i];
          return v;
        };
        if (std::string(reinterpret_cast<char*>(head), 4) != "PKSR") break;
        const auto body = static_cast<std::streamoff>(le(24, 8));
        char hash[17];
        std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(le(16, 8)));
        if (le(4, 2) == 1 && std::string(hash).find(name) != std::string::npos) {
          const std::streamoff at = off + 40 + 48 + (body - 48) / 2;
          f.seekg(at);
          char c = 0;
          f.read(&c, 1);
          c = static_cast<char>(c ^ 0x5a);
          f.seekp(at);
          f.write(&c, 1);
          ++corrupted;
        }
        off += 40 + body;
      }
    }
    return corrupted;
  }

  // Fills the cache with prompts 0..count-1 so that the oldest ones' blocks are demoted to the
  // host and then dropped from it, i.e. written back.
  void push_through_to_storage(int count) {
    for (int p = 0; p < count; ++p) compute_and_finish(static_cast<SequenceId>(p + 1), prompt(p));
    ASSERT_OK(cache_->flush_storage());
    expect_invariants();
  }

  std::string dir_;
  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<FaultInjectionBackend> faults_;  // wraps backend_ for the caches open() makes
  std::unique_ptr<StorageTier> store_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(StorageCacheTest, HostDropsAreWrittenBackAndAnnouncedOnTheStorageTier) {
  open(small_config());
  push_through_to_storage(6);
  const ControlStats st = cache_->stats();
  EXPECT_GT(st.host_blocks_dropped, 0);
  EXPECT_EQ(st.storage_blocks_written, st.host_blocks_dropped)
      << "every dropped host block is written back while staging slots are free";
  EXPECT_EQ(st.storage_bytes_written, st.storage_blocks_written * config_.block_bytes());
  EXPECT_EQ(st.storage_failed_blocks, 0);
  EXPECT_EQ(store_->stats().puts, st.storage_blocks_written);
  int64_t stored_on_storage = 0;
  for (const ControlEvent& e : cache_->drain_events()) {
    if (e.kind == EventKind::kBlockStored && e.tier == Tier::kStorage) {
      ++stored_on_storage;
      EXPECT_EQ(e.tokens.size(), static_cast<size_t>(config_.block_size));
    }
  }
  EXPECT_EQ(stored_on_storage, st.storage_blocks_written);
}

TEST_F(StorageCacheTest, ARestartedCacheFetchesAPromptFromStorageAndReadsTheSameBytes) {
  open(small_config());
  push_through_to_storage(6);  // prompt 0's two blocks went device -> host -> storage first
  ASSERT_GE(cache_->stats().storage_blocks_written, 2);

  open(small_config());  // a new store object and cache on the same directory: a restart
  const std::vector<TokenId> p0 = prompt(0);
  auto fetched = cache_->fetch_from_storage(p0);
  ASSERT_OK(fetched);
  EXPECT_EQ(*fetched, 2);
  EXPECT_LE(cache_->storage_in_flight(), 1);  // the read may already have landed
  expect_invariants();
  ASSERT_OK(cache_->flush_storage());
  EXPECT_EQ(cache_->storage_in_flight(), 0);
  expect_invariants();
  const ControlStats st = cache_->stats();
  EXPECT_EQ(st.storage_hit_blocks, 2);
  EXPECT_EQ(st.storage_bytes_read, 2 * config_.block_bytes());
  EXPECT_EQ(st.host.cached_blocks, 2);

  auto cached = cache_->add_sequence(42, p0);
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 8) << "both full blocks hit on the host tier";
  EXPECT_EQ(cache_->stats().prefix_host_hit_blocks, 2);
  ASSERT_OK(cache_->reserve(42, 1));  // onboards them to the device
  expect_invariants();
  expect_model_bytes(42, p0, 8);

  // A prompt the store never saw fetches nothing.
  EXPECT_EQ(*cache_->fetch_from_storage(prompt(99)), 0);
}

// Found by the fuzzer (a timing-dependent event query): the fetch had registered its arrival
// and queued its read when the poll that follows failed an event query, and the fetch returned
// that error with a host slot taken. The fetch succeeds; the read lands at a later poll.
TEST_F(StorageCacheTest, AFailedPollAfterAFetchLeavesTheFetchDoneAndTheReadLands) {
  open(small_config());
  push_through_to_storage(6);
  ASSERT_GE(cache_->stats().storage_blocks_written, 2);

  faults_ = std::make_unique<FaultInjectionBackend>(*backend_);
  open(small_config());  // a restart, on the fault-injecting backend
  faults_->reset_counts();
  faults_->fail_nth(FaultKind::kQuery, 1);  // the first event query: the poll after the read
  const std::vector<TokenId> p0 = prompt(0);
  auto fetched = cache_->fetch_from_storage(p0);
  ASSERT_OK(fetched);
  EXPECT_EQ(faults_->injected(), 1) << "the query after the read was queued failed";
  EXPECT_EQ(*fetched, 2);
  expect_invariants();
  ASSERT_OK(cache_->flush_storage());
  EXPECT_EQ(cache_->storage_in_flight(), 0);
  EXPECT_EQ(cache_->stats().storage_hit_blocks, 2);
  auto cached = cache_->add_sequence(42, p0);
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 8);
  ASSERT_OK(cache_->reserve(42, 1));
  expect_invariants();
  expect_model_bytes(42, p0, 8);
  cache_.reset();  // before the wrapper it runs on
}

TEST_F(StorageCacheTest, TwoProcessesSharePrefixesThroughTheStore) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support starting threads in a forked child";
#endif
  // A child process computes the prompts and pushes them through to storage; this process,
  // with its own store object and cache on the same directory, then gets the hit. Forked before
  // this process opened a store or a cache, so the only threads left behind are the backend's
  // workers: the child leaves that backend alone and makes its own.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    (void)backend_.release();  // its worker threads did not survive the fork
    backend_ = create_cpu_backend({});
    open(small_config());
    int failures = ::testing::Test::HasFailure() ? 1 : 0;
    if (failures == 0) push_through_to_storage(6);
    failures += ::testing::Test::HasFailure() ? 1 : 0;
    const int64_t written = cache_ != nullptr ? cache_->stats().storage_blocks_written : 0;
    cache_.reset();
    store_.reset();
    _exit(failures == 0 && written >= 2 ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "the writing process failed";
  open(small_config());
  const std::vector<TokenId> p0 = prompt(0);
  EXPECT_EQ(*cache_->fetch_from_storage(p0), 2);
  ASSERT_OK(cache_->flush_storage());
  EXPECT_EQ(*cache_->add_sequence(42, p0), 8);
  ASSERT_OK(cache_->reserve(42, 1));
  expect_invariants();
  expect_model_bytes(42, p0, 8);
}

TEST_F(StorageCacheTest, ATooSmallStoreEvictsAndNeverFailsAStep) {
  const CacheConfig c = small_config();
  open(c, 64, /*max_bytes=*/3 * c.block_bytes());  // room for three of the blocks written back
  push_through_to_storage(10);                     // every step succeeds (ASSERT inside)
  const ControlStats st = cache_->stats();
  EXPECT_GT(st.storage_blocks_written, 3);
  EXPECT_EQ(st.storage_failed_blocks, 0);
  EXPECT_GT(store_->stats().removed, 0) << "the store's bound evicted its oldest blocks";
  // The newest prompts' blocks are the ones kept: the oldest prompt misses, cleanly.
  EXPECT_EQ(*cache_->fetch_from_storage(prompt(0)), 0);
  expect_invariants();
}

TEST_F(StorageCacheTest, ACorruptBlockFileIsAMissNeverGarbage) {
  open(small_config());
  push_through_to_storage(6);
  open(small_config());  // the restarted store lists the blocks; then they rot on disk
  // Flip one byte in the middle of every stored block.
  ASSERT_GT(corrupt_files(""), 0);
  auto fetched = cache_->fetch_from_storage(prompt(0));
  ASSERT_OK(fetched);
  ASSERT_EQ(*fetched, 2) << "the store still lists both blocks: the read finds the damage";
  ASSERT_OK(cache_->flush_storage());
  expect_invariants();
  const ControlStats st = cache_->stats();
  EXPECT_EQ(st.storage_hit_blocks, 0);
  EXPECT_EQ(st.storage_failed_blocks, 2);
  EXPECT_EQ(st.host.cached_blocks, 0) << "a failed read registers nothing";
  EXPECT_EQ(st.host.free_blocks, config_.num_host_blocks) << "its host slots are free again";
  EXPECT_EQ(*cache_->add_sequence(42, prompt(0)), 0);
  expect_invariants();
}

// Only prompt 0's second stored block rots: the read of both lands the first (a hit of one block,
// the first cache's bytes), the second is a miss.
TEST_F(StorageCacheTest, ACorruptSecondBlockLeavesTheFirstAHit) {
  open(small_config());
  push_through_to_storage(6);
  const std::vector<TokenId> p0 = prompt(0);
  const std::vector<TokenId> second(p0.begin() + 4, p0.begin() + 8);
  uint64_t hash = 0;
  for (const ControlEvent& e : cache_->drain_events()) {
    if (e.kind == EventKind::kBlockStored && e.tier == Tier::kStorage && e.tokens == second) {
      hash = e.block_hash;
    }
  }
  ASSERT_NE(hash, 0u) << "prompt 0's second block was written back";
  char name[17];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(hash));
  open(small_config());
  ASSERT_EQ(corrupt_files(name), 1);
  EXPECT_EQ(*cache_->fetch_from_storage(p0), 2);
  ASSERT_OK(cache_->flush_storage());
  expect_invariants();
  const ControlStats st = cache_->stats();
  EXPECT_EQ(st.storage_hit_blocks, 1);
  EXPECT_EQ(st.storage_failed_blocks, 1);
  EXPECT_EQ(st.storage_bytes_read, config_.block_bytes());
  EXPECT_EQ(st.host.cached_blocks, 1);
  EXPECT_EQ(*cache_->add_sequence(42, p0), 4);
  ASSERT_OK(cache_->reserve(42, 1));
  expect_invariants();
  expect_model_bytes(42, p0, 4);
}

TEST_F(StorageCacheTest, AFullWriteBackQueueDropsBlocksAndCountsThem) {
  open(small_config(), /*staging=*/1);
  push_through_to_storage(8);
  const ControlStats st = cache_->stats();
  EXPECT_GT(st.host_blocks_dropped, 1);
  EXPECT_EQ(st.storage_blocks_written + st.storage_writes_dropped, st.host_blocks_dropped);
  EXPECT_GT(st.storage_writes_dropped, 0) << "one staging slot cannot hold a call's two drops";
}

// A prompt of four full blocks, then enough other prompts that its blocks are demoted to a small
// host tier and dropped from it to storage, some within one reserve: a block demoted into a host
// slot that another block has just left, then dropped from that slot in the same call. The
// write-back must store the block's own bytes (still in its device block when the drop is
// staged), not the slot's previous occupant's: a restarted cache that hits the prefix reads back
// exactly the model's K/V. Both cases failed before the fix (a block of the prefix came back
// holding another block's bytes, with a valid checksum).
struct WriteBackCase {
  int64_t host_blocks;
  int others;        // prompts computed after prompt 0
  int other_length;  // their tokens
  int finish_every;  // every n-th of them is finished; the rest stay (inactive), so offloads
};

class StorageWriteBackTest : public StorageCacheTest,
                             public ::testing::WithParamInterface<WriteBackCase> {};

TEST_P(StorageWriteBackTest, ARestartedCacheReadsBackTheDroppedBlocksOwnBytes) {
  const WriteBackCase& w = GetParam();
  CacheConfig c = small_config();
  c.num_device_blocks = 8;
  c.num_host_blocks = w.host_blocks;
  open(c);
  std::vector<TokenId> p0;
  for (int i = 0; i < 17; ++i) p0.push_back(7000 + 13 * i);
  compute_and_finish(1, p0);
  for (int p = 1; p <= w.others; ++p) {
    std::vector<TokenId> other;
    for (int i = 0; i < w.other_length; ++i) other.push_back(100000 * p + i);
    compute(static_cast<SequenceId>(p + 1), other, /*finish=*/p % w.finish_every == 0);
  }
  ASSERT_OK(cache_->flush_storage());
  ASSERT_EQ(*cache_->cached_prefix(p0), 0) << "prompt 0 left both in-process tiers";
  ASSERT_GE(cache_->stats().storage_blocks_written, 4);

  open(c);  // a restart over the same directory
  auto fetched = cache_->fetch_from_storage(p0);
  ASSERT_OK(fetched);
  const int64_t blocks = std::min<int64_t>(4, c.num_host_blocks);
  EXPECT_EQ(*fetched, blocks);
  ASSERT_OK(cache_->flush_storage());
  expect_invariants();
  auto cached = cache_->add_sequence(42, p0);
  ASSERT_OK(cached);
  ASSERT_EQ(*cached, blocks * c.block_size);
  ASSERT_OK(cache_->reserve(42, 1));
  expect_invariants();
  expect_model_bytes(42, p0, *cached);
}

INSTANTIATE_TEST_SUITE_P(Pressure, StorageWriteBackTest,
                         ::testing::Values(WriteBackCase{2, 6, 17, 1}, WriteBackCase{4, 6, 9, 3}),
                         [](const ::testing::TestParamInfo<WriteBackCase>& i) {
                           return std::to_string(i.param.host_blocks) + "HostBlocks";
                         });

TEST_F(StorageCacheTest, AStoreOfAnotherLayoutOrACacheWithoutAHostTierIsRefused) {
  CacheConfig c = small_config();
  FileTierOptions fo;
  fo.directory = dir_;
  CacheConfig other = c;
  other.head_dim = 16;
  auto store = make_file_tier(StorageLayout::from_config(other, "test-model"), fo);
  ASSERT_OK(store);
  KvCacheOptions o;
  o.backend = backend_.get();
  o.storage = store->get();
  EXPECT_EQ(KvCache::create(c, o).status().code(), StatusCode::kInvalidArgument);
  c.num_host_blocks = 0;
  auto same = make_file_tier(StorageLayout::from_config(c, "test-model"), fo);
  ASSERT_OK(same);
  o.storage = same->get();
  EXPECT_EQ(KvCache::create(c, o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv
