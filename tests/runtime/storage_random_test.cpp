// The randomized test of the storage path on real bytes: the soak workload (tools/soak) over a
// KvCache with a FileTier on a real directory behind a small host tier. Random prompts sharing
// prefixes, random pressure on both in-process tiers (demotions and host drops within the same
// calls, offloads, restores, prefetches, forks, rollbacks), every add fetching its prompt's
// blocks from storage first, and restarts of the cache over the same directory with a new store
// object, as a new process would open it. Every verify compares every gathered byte with the
// model (the K/V of a position is a pure function of the prefix), so a block written back or
// read back with the wrong bytes is a mismatch; check_invariants() after every step. Also the same
// with backend faults injected into every kind of call the cache makes (the staging copies and
// their events included): a failed call changes nothing, and every byte still matches.
//
// PAGEDKV_STORAGE_STEPS sets the steps per seed (kDefaultSteps).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <memory>
#include <random>
#include <string>

#include "kv_workload.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/storage_tier.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using soak::KvWorkload;
using soak::WorkloadCounters;
using soak::WorkloadOptions;

constexpr int64_t kDefaultSteps = 6000;
constexpr int kRestarts = 3;  // each seed runs its steps over this many caches plus one

int64_t steps_from_env() {
  const char* s = std::getenv("PAGEDKV_STORAGE_STEPS");
  return s != nullptr ? std::atoll(s) : kDefaultSteps;
}

std::string describe(const WorkloadCounters& c) {
  return "ops " + std::to_string(c.ops) + ", verified " + std::to_string(c.verified_sequences) +
         ", storage fetches " + std::to_string(c.storage_fetches) +
         "; first problem: " + (c.first_problem.empty() ? "none" : c.first_problem);
}

// The pressure config with a host tier smaller than the device's, so that cached blocks are
// demoted and dropped from it within the same calls, and written back all the time.
CacheConfig storage_pressure_config(int64_t host_blocks) {
  CacheConfig c = soak::pressure_config();
  c.num_device_blocks = 16;
  c.num_host_blocks = host_blocks;
  return c;
}

class StorageRandomTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pagedkv-storage-random-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    workload_.reset();
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A new store object on the directory.
  void open_store(const CacheConfig& c) {
    store_.reset();
    FileTierOptions fo;
    fo.directory = dir_;
    auto store = make_file_tier(StorageLayout::from_config(c, "random-model"), fo);
    ASSERT_OK(store);
    store_ = std::move(store).value();
  }

  std::string dir_;
  std::unique_ptr<StorageTier> store_;
  std::unique_ptr<KvWorkload> workload_;
};

TEST_P(StorageRandomTest, EveryByteReadBackFromStorageIsTheModels) {
  const int64_t steps = steps_from_env() / (kRestarts + 1);
  int64_t hits = 0, written = 0, host_drops = 0;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    WorkloadOptions o;
    o.seed = seed * 7919 + static_cast<uint64_t>(GetParam());
    o.config = storage_pressure_config(GetParam());
    o.copy_delay = std::chrono::microseconds(seed == 1 ? 20 : 0);
    o.verify_percent = 12;
    open_store(o.config);
    o.storage = store_.get();
    auto w = KvWorkload::create(o);
    ASSERT_OK(w);
    workload_ = std::move(w).value();
    for (int epoch = 0; epoch <= kRestarts; ++epoch) {
      if (epoch > 0) {
        ASSERT_OK(workload_->stop_cache()) << describe(workload_->counters());
        open_store(o.config);  // the next "process" opens the directory anew
        ASSERT_OK(workload_->start_cache(store_.get())) << describe(workload_->counters());
      }
      workload_->run(steps);
      workload_->verify_all();
      const WorkloadCounters& c = workload_->counters();
      ASSERT_EQ(c.mismatches, 0) << "seed " << o.seed << " epoch " << epoch << ": " << describe(c);
      ASSERT_EQ(c.invariant_failures, 0) << describe(c);
      ASSERT_EQ(c.errors, 0) << describe(c);
      const ControlStats st = workload_->cache().stats();
      hits += st.storage_hit_blocks;
      written += st.storage_blocks_written;
      host_drops += st.host_blocks_dropped;
    }
    workload_.reset();
  }
  // The run really went through storage: blocks written back, and prompts hitting blocks read
  // back from it (each verified afterwards).
  EXPECT_GT(written, 100);
  EXPECT_GT(hits, 50);
  EXPECT_GT(host_drops, 100);
}

// Faults everywhere, as KvCacheRandomized.InjectedFaultsLoseNothing, over a storage tier: every
// 10 steps one kind of the cache's backend calls (copy, launch, event, sync in turn) is armed to
// fail within its next 30 calls, and the workload's own I/O too; a restart every quarter (with
// the faults disarmed meanwhile). Every fault is tolerated and every verified byte matches.
TEST_P(StorageRandomTest, InjectedFaultsLoseNothing) {
  std::unique_ptr<Backend> inner = create_cpu_backend({});
  FaultInjectionBackend cache_backend(*inner);
  FaultInjectionBackend io_backend(*inner);
  WorkloadOptions o;
  o.seed = 29 + static_cast<uint64_t>(GetParam());
  o.config = storage_pressure_config(GetParam());
  o.backend = &cache_backend;
  o.io_backend = &io_backend;
  o.tolerate_injected_faults = true;
  open_store(o.config);
  o.storage = store_.get();
  auto w = KvWorkload::create(o);
  ASSERT_OK(w);
  workload_ = std::move(w).value();
  const FaultKind kinds[] = {FaultKind::kCopy, FaultKind::kLaunch, FaultKind::kEvent,
                             FaultKind::kSync, FaultKind::kQuery};
  std::mt19937_64 rng(o.seed);
  const int64_t steps = std::min<int64_t>(steps_from_env(), 4000);
  for (int64_t done = 0; done < steps && !workload_->has_problem(); done += 10) {
    if (done > 0 && done % (steps / 4 / 10 * 10) == 0) {
      cache_backend.disarm_all();
      io_backend.disarm_all();
      ASSERT_OK(workload_->stop_cache()) << describe(workload_->counters());
      open_store(o.config);
      ASSERT_OK(workload_->start_cache(store_.get())) << describe(workload_->counters());
    }
    cache_backend.disarm_all();
    cache_backend.fail_nth(kinds[(done / 10) % std::size(kinds)],
                           1 + static_cast<int64_t>(rng() % 30));
    for (FaultKind kind : kinds) {
      if (!io_backend.armed(kind)) io_backend.fail_nth(kind, 1 + static_cast<int64_t>(rng() % 30));
    }
    workload_->run(10);
  }
  cache_backend.disarm_all();
  io_backend.disarm_all();
  workload_->verify_all();
  const WorkloadCounters& c = workload_->counters();
  EXPECT_EQ(c.mismatches, 0) << describe(c);
  EXPECT_EQ(c.invariant_failures, 0) << describe(c);
  EXPECT_EQ(c.errors, 0) << describe(c);
  EXPECT_GT(c.injected_faults - io_backend.injected(), steps / 40) << describe(c);
  EXPECT_GT(c.storage_fetches, 10) << describe(c);
  EXPECT_GT(c.verified_sequences, steps / 50) << describe(c);
  workload_.reset();  // before the fault-injecting backends it uses
}

INSTANTIATE_TEST_SUITE_P(HostBlocks, StorageRandomTest, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int64_t>& i) {
                           return std::to_string(i.param) + "HostBlocks";
                         });

}  // namespace
}  // namespace pagedkv
