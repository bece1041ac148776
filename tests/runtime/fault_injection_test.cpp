// KvCache under backend faults. A fixed scenario (shared prefixes, copy-on-write after fork,
// offload under memory pressure, explicit offload and restore, gather, build_batch, rollback,
// finish and prefix reuse) runs on a backend wrapped by FaultInjectionBackend; it is rerun
// from scratch with the n-th allocation, copy, launch, event or sync call failing, for every n
// the fault-free run reaches. The contract checked each time: the failed cache call returns the
// injected kInternal error and changes nothing, so a retry succeeds; check_invariants() holds
// after every call; at the end every live sequence reads back exactly the bytes of its token
// list (tests/runtime/kv_model.hpp) and the cache still takes, writes and reads one more token
// per sequence. The workload's own uploads and downloads go through the inner backend, so only
// the cache's calls are counted and failed. Every test runs on both backends
// (runtime_backends.hpp); on the CPU backend the copies are delayed so that transfers really lag.
//
// A second, storage scenario runs the same way with a FileTier behind a host tier of 2 blocks: a
// prompt's blocks are demoted and dropped to storage (demotions and drops in the same calls),
// fetched back and hit by a new sequence, whose bytes must be the model's. A failed call there
// may keep what a tier move keeps (host blocks it dropped), and the storage counters move as
// write-backs finish in the background; nothing else may change.
//
// Both scenarios run on a cache of two KV groups too (fault_scenario.hpp,
// two_group_scenario_config: a full-attention group and a sliding-window group of 8 tokens with
// other head counts and dims, sharing the logical blocks; a FileTier per group in the storage
// scenario): every model layer is written and read in its group's shape, the window group's
// layers are read over the window only, the batch is build_batches', and what a failed call
// must leave unchanged includes every group's block locations and group_stats.
//
// PAGEDKV_FAULT_STRIDE=k sweeps every k-th n past the first 50 of each kind (default 1: all; the
// two-group sweeps take about 13 s on 2 CPU cores at stride 1, so they sweep every n too);
// PAGEDKV_FAULT_VERBOSE=1 prints one line per run (where the fault fired, whether it surfaced).
#include "pagedkv/fault_injection.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "runtime/fault_scenario.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::describe;
using testing::DeviceBuffer;
using testing::FaultScenario;
using testing::model_rows;
using testing::RunReport;
using testing::scenario_config;
using testing::ScenarioSetup;
using testing::slow_copy_backend;

constexpr FaultKind kAllKinds[] = {FaultKind::kAllocation, FaultKind::kCopy, FaultKind::kLaunch,
                                   FaultKind::kEvent,      FaultKind::kSync, FaultKind::kQuery};
int64_t stride_from_env() {
  const char* s = std::getenv("PAGEDKV_FAULT_STRIDE");
  const int64_t stride = s != nullptr ? std::atoll(s) : 1;
  return stride > 0 ? stride : 1;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += "\n    - " + s;
  return out;
}

ScenarioSetup one_group(int64_t kernel_block_bytes = kDefaultTransferKernelBlockBytes,
                        bool storage = false) {
  return {storage ? testing::storage_scenario_config() : scenario_config(), kernel_block_bytes,
          storage};
}

ScenarioSetup two_groups(int64_t kernel_block_bytes = kDefaultTransferKernelBlockBytes,
                         bool storage = false) {
  return {
      storage ? testing::two_group_storage_scenario_config() : testing::two_group_scenario_config(),
      kernel_block_bytes, storage};
}

class KvCacheFaultInjection : public testing::BackendParamTest {};
INSTANTIATE_TEST_SUITE_P(Backends, KvCacheFaultInjection, testing::runtime_backends(),
                         testing::backend_param_name);

TEST_P(KvCacheFaultInjection, TheScenarioWithoutFaultsMatchesTheModel) {
  const RunReport clean = FaultScenario(kind(), FaultKind::kCopy, 0).run();
  EXPECT_TRUE(clean.problems.empty()) << join(clean.problems);
  EXPECT_TRUE(clean.fault.empty());
  // The scenario reaches every path that issues backend work.
  EXPECT_GT(clean.prefix_hit_tokens, 0);
  EXPECT_GT(clean.stats.copy_on_write, 0);
  EXPECT_GT(clean.pressure_offloads, 0);
  EXPECT_GE(clean.stats.sequences_offloaded, clean.pressure_offloads + 2);
  EXPECT_GT(clean.stats.sequences_restored, 0);
  EXPECT_GE(clean.verified, 8);
  for (FaultKind kind : kAllKinds) {
    EXPECT_GT(clean.counts[static_cast<size_t>(kind)], 0) << fault_kind_name(kind);
    RecordProperty(std::string("calls_") + fault_kind_name(kind),
                   std::to_string(clean.counts[static_cast<size_t>(kind)]));
  }
}

// Reruns the scenario of `setup` with the n-th call of each of `kinds` failing, for every n the
// fault-free run reaches (with the given config, transfer path and workload).
void sweep(BackendKind backend, const std::vector<FaultKind>& kinds, const ScenarioSetup& setup) {
  const RunReport clean = FaultScenario(backend, FaultKind::kCopy, 0, setup).run();
  ASSERT_TRUE(clean.problems.empty()) << join(clean.problems);
  const int64_t stride = stride_from_env();
  const bool verbose = std::getenv("PAGEDKV_FAULT_VERBOSE") != nullptr;  // one line per run
  const auto t0 = std::chrono::steady_clock::now();
  std::ostringstream summary;
  for (FaultKind kind : kinds) {
    const int64_t calls = clean.counts[static_cast<size_t>(kind)];
    int64_t runs = 0, fired = 0, surfaced = 0, failing = 0;
    for (int64_t n = 1; n <= calls; n = n < 50 ? n + 1 : n + stride) {
      const RunReport r = FaultScenario(backend, kind, n, setup).run();
      ++runs;
      fired += r.fault.empty() ? 0 : 1;
      surfaced += r.surfaced ? 1 : 0;
      if (verbose) {
        std::cout << fault_kind_name(kind) << " n=" << n << ": " << r.fault << " in '"
                  << r.fault_step << "'" << (r.surfaced ? "" : " (absorbed)")
                  << (r.problems.empty() ? " ok" : " FAILING") << "\n";
      }
      if (r.problems.empty()) continue;
      ++failing;
      ADD_FAILURE() << fault_kind_name(kind) << " n=" << n << ": "
                    << (r.fault.empty() ? "(the fault never fired)" : r.fault) << " in step '"
                    << r.fault_step << "'" << (r.surfaced ? "" : " (absorbed by the cache)")
                    << join(r.problems);
    }
    summary << fault_kind_name(kind) << ": " << calls << " calls, " << runs << " runs, " << fired
            << " fired, " << surfaced << " surfaced, " << failing << " failing\n";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << summary.str() << "sweep: " << seconds << " s\n";
  ::testing::Test::RecordProperty("sweep_seconds", std::to_string(seconds));
}

// The scenario's blocks are small: offloads and restores go through the copy kernel, so a
// failed transfer is a failed launch (or a failed allocation of its pairs buffer).
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesTheCacheConsistent) {
  sweep(kind(), {std::begin(kAllKinds), std::end(kAllKinds)}, one_group());
}

// The same with batched copies (threshold 0): a failed transfer is a failed copy_batch. Only
// the kinds whose calls differ between the paths.
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesTheCacheConsistentWithBatchedCopies) {
  sweep(kind(), {FaultKind::kCopy, FaultKind::kAllocation}, one_group(0));
}

// The storage scenario without faults reaches write-back and a hit read back from storage.
TEST_P(KvCacheFaultInjection, TheStorageScenarioWithoutFaultsMatchesTheModel) {
  const RunReport clean =
      FaultScenario(kind(), FaultKind::kCopy, 0, one_group(kDefaultTransferKernelBlockBytes, true))
          .run();
  EXPECT_TRUE(clean.problems.empty()) << join(clean.problems);
  EXPECT_GE(clean.stats.storage_blocks_written, 4);
  EXPECT_EQ(clean.stats.storage_hit_blocks, 2) << "A's first two blocks fill the host tier";
  EXPECT_GE(clean.prefix_hit_tokens, 8);
  EXPECT_GE(clean.verified, 2);
}

// The storage scenario with the n-th call of every kind failing: the staging copies, their
// events, the storage reads' events, every cache call around them.
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesTheCacheConsistentWithAStorageTier) {
  sweep(kind(), {std::begin(kAllKinds), std::end(kAllKinds)},
        one_group(kDefaultTransferKernelBlockBytes, /*storage=*/true));
}

// ---- a cache of two KV groups (a full-attention and a sliding-window group) ----

// The two-group scenario without faults reaches what the one-group one does, and the window
// group releases pages (a gather before them is refused).
TEST_P(KvCacheFaultInjection, TheTwoGroupScenarioWithoutFaultsMatchesTheModel) {
  const RunReport clean = FaultScenario(kind(), FaultKind::kCopy, 0, two_groups()).run();
  EXPECT_TRUE(clean.problems.empty()) << join(clean.problems);
  EXPECT_TRUE(clean.fault.empty());
  EXPECT_GT(clean.prefix_hit_tokens, 0);
  EXPECT_GT(clean.stats.copy_on_write, 0);
  EXPECT_GT(clean.pressure_offloads, 0);
  EXPECT_GE(clean.stats.sequences_offloaded, clean.pressure_offloads + 2);
  EXPECT_GT(clean.stats.sequences_restored, 0);
  EXPECT_GE(clean.verified, 8);
  EXPECT_GT(clean.out_of_window_refusals, 0);
  ASSERT_EQ(clean.group_stats.size(), 2u);
  EXPECT_GT(clean.group_stats[1].window_released_blocks, 0);
  for (FaultKind kind : kAllKinds) {
    EXPECT_GT(clean.counts[static_cast<size_t>(kind)], 0) << fault_kind_name(kind);
    RecordProperty(std::string("calls_") + fault_kind_name(kind),
                   std::to_string(clean.counts[static_cast<size_t>(kind)]));
  }
}

// Every kind of fault in the two-group scenario through the copy kernel: a failed move must be
// taken back in both groups (each group's block locations and group_stats are in the snapshot;
// only pages it evicted, which are counted, may stay evicted: forgive_group_evictions).
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesATwoGroupCacheConsistent) {
  sweep(kind(), {std::begin(kAllKinds), std::end(kAllKinds)}, two_groups());
}

// The same with batched copies: the kinds whose calls differ between the paths.
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesATwoGroupCacheConsistentWithBatchedCopies) {
  sweep(kind(), {FaultKind::kCopy, FaultKind::kAllocation}, two_groups(0));
}

// The storage scenario with a FileTier per group (each with its own model id): write-back of
// both groups' pages, and a hit read back from both stores.
TEST_P(KvCacheFaultInjection, TheTwoGroupStorageScenarioWithoutFaultsMatchesTheModel) {
  const RunReport clean =
      FaultScenario(kind(), FaultKind::kCopy, 0, two_groups(kDefaultTransferKernelBlockBytes, true))
          .run();
  EXPECT_TRUE(clean.problems.empty()) << join(clean.problems);
  ASSERT_EQ(clean.group_stats.size(), 2u);
  EXPECT_GE(clean.stats.storage_blocks_written, 4);
  EXPECT_EQ(clean.stats.storage_hit_blocks, 4) << "A's four blocks fill the full group's host tier";
  // The window group's pages of the hit's window come back in the same arrival.
  const int64_t full_bytes =
      testing::two_group_storage_scenario_config().group_config(0).block_bytes();
  EXPECT_GT(clean.stats.storage_bytes_read, clean.stats.storage_hit_blocks * full_bytes);
  EXPECT_GE(clean.prefix_hit_tokens, 16);
  EXPECT_GE(clean.verified, 2);
}

TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesATwoGroupCacheConsistentWithStorage) {
  sweep(kind(), {std::begin(kAllKinds), std::end(kAllKinds)},
        two_groups(kDefaultTransferKernelBlockBytes, /*storage=*/true));
}

// KvCache::create allocates (pools, upload ring) and creates a stream and events: a fault in any
// of them makes create return it and leaves nothing behind.
TEST_P(KvCacheFaultInjection, CreateFailsCleanlyAtEveryFault) {
  const CacheConfig config = scenario_config();
  std::array<int64_t, kNumFaultKinds> calls{};
  {
    auto inner = slow_copy_backend(this->kind());
    ASSERT_NE(inner, nullptr);
    FaultInjectionBackend fi(*inner);
    KvCacheOptions options;
    options.backend = &fi;
    auto cache = KvCache::create(config, options);
    ASSERT_OK(cache);
    for (FaultKind kind : kAllKinds) {
      calls[static_cast<size_t>(kind)] = fi.count(kind);
    }
    cache = StatusOr<std::unique_ptr<KvCache>>(internal_error("released"));
    EXPECT_EQ(fi.live(), LiveObjects{}) << describe(fi.live());
  }
  EXPECT_GE(calls[static_cast<size_t>(FaultKind::kAllocation)], 2);
  int64_t runs = 0;
  for (FaultKind kind : kAllKinds) {
    for (int64_t n = 1; n <= calls[static_cast<size_t>(kind)]; ++n) {
      ++runs;
      auto inner = slow_copy_backend(this->kind());
      ASSERT_NE(inner, nullptr);
      FaultInjectionBackend fi(*inner);
      fi.fail_nth(kind, n);
      KvCacheOptions options;
      options.backend = &fi;
      auto cache = KvCache::create(config, options);
      const std::string where = std::string(fault_kind_name(kind)) + " #" + std::to_string(n) +
                                " (" + fi.last_fault() + ")";
      ASSERT_EQ(fi.injected(), 1) << where;
      ASSERT_FALSE(cache.ok()) << where << ": create succeeded";
      EXPECT_EQ(cache.status().code(), StatusCode::kInternal) << where;
      EXPECT_NE(cache.status().message().find("injected fault"), std::string::npos)
          << where << ": " << cache.status().to_string();
      EXPECT_EQ(fi.live(), LiveObjects{}) << where << ": left " << describe(fi.live());
      // Nothing is left armed: the next create works and releases everything.
      auto again = KvCache::create(config, options);
      ASSERT_OK(again) << where;
      again = StatusOr<std::unique_ptr<KvCache>>(internal_error("released"));
      EXPECT_EQ(fi.live(), LiveObjects{}) << where << ": left " << describe(fi.live());
    }
  }
  EXPECT_GT(runs, 3);
}

// A failed kernel launch (or slot-mapping upload) inside write_kv returns the error; the same
// write_kv then succeeds and the bytes are right.
TEST_P(KvCacheFaultInjection, WriteKvRecoversFromAFailedLaunchOrUpload) {
  const CacheConfig config = scenario_config();
  for (FaultKind kind : {FaultKind::kLaunch, FaultKind::kCopy}) {
    auto inner = slow_copy_backend(this->kind());
    ASSERT_NE(inner, nullptr);
    FaultInjectionBackend fi(*inner);
    KvCacheOptions options;
    options.backend = &fi;
    auto created = KvCache::create(config, options);
    ASSERT_OK(created);
    std::unique_ptr<KvCache> cache = std::move(created).value();
    const std::vector<TokenId> prompt = {3, 1, 4, 1, 5, 9, 2};
    const int64_t n = static_cast<int64_t>(prompt.size());
    ASSERT_OK(cache->add_sequence(7, prompt));
    ASSERT_OK(cache->reserve(7, n));
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      const std::vector<uint16_t> k = model_rows(config, layer, 0, prompt, 0);
      const std::vector<uint16_t> v = model_rows(config, layer, 1, prompt, 0);
      DeviceBuffer dk(*inner, k.size() * 2), dv(*inner, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      // The slot mapping is uploaded by the first write_kv of a reservation only.
      if (kind == FaultKind::kCopy && layer > 0) {
        ASSERT_OK(cache->write_kv(7, layer, dk.data(), dv.data(), DType::kFloat16));
        ASSERT_OK(cache->synchronize());
        continue;
      }
      fi.fail_nth(kind, 1);
      const Status failed = cache->write_kv(7, layer, dk.data(), dv.data(), DType::kFloat16);
      EXPECT_EQ(failed.code(), StatusCode::kInternal) << fault_kind_name(kind);
      EXPECT_NE(failed.message().find(std::string("injected fault: ") + fault_kind_name(kind)),
                std::string::npos)
          << failed.to_string();
      EXPECT_OK(cache->check_invariants());
      const Status again = cache->write_kv(7, layer, dk.data(), dv.data(), DType::kFloat16);
      ASSERT_OK(again) << fault_kind_name(kind);
      ASSERT_OK(cache->synchronize());  // the inputs go out of scope
    }
    ASSERT_OK(cache->commit(7, prompt));
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      const size_t elems = static_cast<size_t>(n * config.num_kv_heads * config.head_dim);
      DeviceBuffer k(*inner, elems * 2), v(*inner, elems * 2);
      ASSERT_OK(cache->gather_layer(7, layer, k.data(), v.data(), DType::kFloat16,
                                    PackedLayout::kTokenMajor));
      ASSERT_OK(cache->synchronize());
      EXPECT_EQ(k.download<uint16_t>(), model_rows(config, layer, 0, prompt, 0))
          << fault_kind_name(kind) << " layer " << layer;
      EXPECT_EQ(v.download<uint16_t>(), model_rows(config, layer, 1, prompt, 0))
          << fault_kind_name(kind) << " layer " << layer;
    }
    EXPECT_EQ(fi.injected(), kind == FaultKind::kCopy ? 1 : config.num_layers);
  }
}

}  // namespace
}  // namespace pagedkv
