// The randomized end-to-end test of KvCache on real bytes, run through the soak workload
// (tools/soak/kv_workload.hpp): sequences with shared prefixes are added, extended, rolled back,
// forked, finished, erased, offloaded, restored and set active under memory pressure in both
// tiers; every gathered byte is compared with a pure-function model of the K/V and the
// invariants are checked after every step. Also: the checks can fail (a byte changed behind the
// cache's back is reported), and backend faults injected into every kind of call lose nothing.
//
// Each test runs on both backends (runtime_backends.hpp); the copy delays are the CPU backend's.
//
// PAGEDKV_E2E_STEPS sets the total number of steps (the suite runs kDefaultSteps).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kv_workload.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/layout.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using soak::KvWorkload;
using soak::WorkloadCounters;
using soak::WorkloadOptions;

constexpr int64_t kDefaultSteps = 100000;
// Below this many steps per seed the pressure checks (evictions, offloads) are not asserted.
constexpr int64_t kPressureFloorSteps = 4000;

int64_t steps_from_env() {
  const char* s = std::getenv("PAGEDKV_E2E_STEPS");
  return s != nullptr ? std::atoll(s) : kDefaultSteps;
}

std::string describe(const WorkloadCounters& c) {
  return "ops " + std::to_string(c.ops) + ", verified " + std::to_string(c.verified_sequences) +
         ", exhausted " + std::to_string(c.exhausted) + ", evicted " + std::to_string(c.evicted) +
         ", injected " + std::to_string(c.injected_faults) +
         "; first problem: " + (c.first_problem.empty() ? "none" : c.first_problem);
}

void expect_clean(const WorkloadCounters& c) {
  EXPECT_EQ(c.mismatches, 0) << describe(c);
  EXPECT_EQ(c.invariant_failures, 0) << describe(c);
  EXPECT_EQ(c.errors, 0) << describe(c);
}

std::unique_ptr<KvWorkload> make_workload(const WorkloadOptions& options) {
  auto w = KvWorkload::create(options);
  EXPECT_OK(w);
  return w.ok() ? std::move(w).value() : nullptr;
}

class KvCacheRandomized : public testing::BackendParamTest {
 protected:
  // Points `options` at a backend of the test's kind: on the CPU the workload makes its own
  // (with options.copy_delay); on CUDA it borrows one owned by the test.
  void use_backend(WorkloadOptions& options) {
    if (kind() == BackendKind::kCpu) return;
    if (owned_ == nullptr) owned_ = testing::make_backend(kind());
    ASSERT_NE(owned_, nullptr);
    options.backend = owned_.get();
  }

  std::unique_ptr<Backend> owned_;
};
INSTANTIATE_TEST_SUITE_P(Backends, KvCacheRandomized, testing::runtime_backends(),
                         testing::backend_param_name);

// Each seed runs its share of the steps. On the CPU backend seed 1 keeps the 50 us copy delay,
// so offloads, demotions and restores really lag behind the compute stream; seed 2 has 5 us
// (about 60 us of sleep in practice); seeds 3 and 4 have none (copies still run on the copy
// stream's own thread), so most steps go to ops rather than to sleeping. On CUDA the copies lag
// by themselves and the delays do not apply.
struct SeedRun {
  uint64_t seed;
  std::chrono::microseconds copy_delay;
  int64_t percent;  // of the steps
};

TEST_P(KvCacheRandomized, EveryGatheredByteMatchesTheModel) {
  const std::vector<SeedRun> runs = {{1, std::chrono::microseconds(50), 15},
                                     {2, std::chrono::microseconds(5), 10},
                                     {3, std::chrono::microseconds(0), 50},
                                     {4, std::chrono::microseconds(0), 25}};
  const int64_t total = steps_from_env();
  int64_t ran = 0;
  for (const SeedRun& r : runs) {
    SCOPED_TRACE("seed " + std::to_string(r.seed) + ", copy delay " +
                 (kind() == BackendKind::kCpu ? std::to_string(r.copy_delay.count()) + " us"
                                              : std::string("none (CUDA)")));
    WorkloadOptions options;
    options.seed = r.seed;
    options.copy_delay = r.copy_delay;
    use_backend(options);
    std::unique_ptr<KvWorkload> w = make_workload(options);
    ASSERT_NE(w, nullptr);
    const int64_t steps = total * r.percent / 100;
    w->run(steps);
    w->verify_all();
    const WorkloadCounters& c = w->counters();
    expect_clean(c);
    EXPECT_EQ(c.ops, steps) << describe(c);
    ran += c.ops;
    if (steps >= kPressureFloorSteps) {  // pressure really happened, and checks really ran
      const ControlStats stats = w->cache().stats();
      EXPECT_GT(c.verified_sequences, steps / 50) << describe(c);
      EXPECT_GT(c.verified_bytes, steps * 10) << describe(c);
      EXPECT_GT(c.exhausted, 0) << describe(c);
      EXPECT_GT(c.evicted, 0) << describe(c);
      EXPECT_GT(c.offload_calls, 0) << describe(c);
      EXPECT_GT(stats.sequences_offloaded, c.offload_calls) << "no offload made room";
      EXPECT_GT(stats.blocks_restored, 0);
      EXPECT_GT(stats.copy_on_write, 0);
      EXPECT_GT(stats.prefix_hit_blocks, 0);
      EXPECT_GT(stats.blocks_demoted, 0) << "the host tier never held a cached prefix";
      EXPECT_GT(stats.prefix_host_hit_blocks, 0) << "no prompt hit a host-resident prefix";
      EXPECT_GT(c.prefetch_calls, 0);
    }
    RecordProperty("verified_sequences_seed" + std::to_string(r.seed),
                   static_cast<int>(c.verified_sequences));
  }
  RecordProperty("steps", static_cast<int>(ran));
}

// The workload's small blocks take the copy kernel by default; the batched copy (threshold 0)
// must keep every byte too, and so must the kernel forced for any block size. Same seed, same
// ops: both runs make the same calls and verify the same sequences.
TEST_P(KvCacheRandomized, BothTransferPathsMatchTheModel) {
  const int64_t steps = std::max<int64_t>(steps_from_env() / 10, 500);
  WorkloadCounters counters[2];
  for (int path = 0; path < 2; ++path) {
    SCOPED_TRACE(path == 0 ? "batched copies" : "copy kernel");
    WorkloadOptions options;
    options.seed = 5;
    options.copy_delay = std::chrono::microseconds(5);
    options.transfer_kernel_block_bytes = path == 0 ? 0 : int64_t{1} << 40;
    use_backend(options);
    std::unique_ptr<KvWorkload> w = make_workload(options);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->cache().pool_info().transfer_kernel, path == 1);
    w->run(steps);
    w->verify_all();
    counters[path] = w->counters();
    expect_clean(counters[path]);
    EXPECT_GT(w->cache().stats().blocks_restored, 0);
    EXPECT_GT(w->cache().stats().sequences_offloaded, 0);
  }
  EXPECT_EQ(counters[0].ops, counters[1].ops);
  EXPECT_EQ(counters[0].verified_sequences, counters[1].verified_sequences);
  EXPECT_EQ(counters[0].verified_bytes, counters[1].verified_bytes);
}

// The checks can fail: a byte of a live sequence changed in the device pool behind the cache's
// back (copied out, changed, copied back) is reported with its coordinates.
TEST_P(KvCacheRandomized, AByteChangedInTheDevicePoolIsReported) {
  WorkloadOptions options;
  options.seed = 7;
  options.copy_delay = std::chrono::microseconds(0);
  use_backend(options);
  std::unique_ptr<KvWorkload> w = make_workload(options);
  ASSERT_NE(w, nullptr);
  w->run(3000);
  expect_clean(w->counters());
  KvCache& cache = w->cache();
  ASSERT_OK(cache.synchronize());

  // A live, device-resident sequence of at least two blocks.
  SequenceId victim = 0;
  for (SequenceId id : w->live_sequences()) {
    const auto where = cache.residency(id);
    ASSERT_OK(where);
    if (*where == SequenceResidency::kDevice &&
        static_cast<int64_t>(w->model_tokens(id).size()) > cache.config().block_size) {
      victim = id;
      break;
    }
  }
  ASSERT_NE(victim, 0u) << "no device-resident sequence longer than a block after 3000 steps";
  const int64_t length = static_cast<int64_t>(w->model_tokens(victim).size());
  const int64_t position = length - 1;  // the last committed token, past the first block
  const auto blocks = cache.block_locations(victim);
  ASSERT_OK(blocks);
  const BlockLocation& b = (*blocks)[static_cast<size_t>(position / cache.config().block_size)];
  ASSERT_EQ(b.tier, Tier::kDevice);

  // Verified clean first, so the change below is the only difference.
  const int64_t verified = w->counters().verified_sequences;
  ASSERT_TRUE(w->verify_sequence(victim)) << describe(w->counters());
  EXPECT_EQ(w->counters().verified_sequences, verified + 1);

  const PoolRef pool = cache.device_pool();
  const int64_t offset = pool.layout.element_offset(
      b.block, 1, KvPart::kValue, static_cast<int32_t>(position % cache.config().block_size), 1, 3);
  uint16_t* element = static_cast<uint16_t*>(pool.data) + offset;
  uint16_t bits = 0;
  Backend& backend = cache.backend();
  ASSERT_OK(backend.copy_async(&bits, element, sizeof bits, CopyKind::kDeviceToHost, Stream{}));
  ASSERT_OK(backend.synchronize_stream(Stream{}));
  bits ^= 0x0100;
  ASSERT_OK(backend.copy_async(element, &bits, sizeof bits, CopyKind::kHostToDevice, Stream{}));
  ASSERT_OK(backend.synchronize_stream(Stream{}));

  EXPECT_FALSE(w->verify_sequence(victim));
  const WorkloadCounters& c = w->counters();
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_EQ(c.errors, 0);
  EXPECT_NE(c.first_problem.find("seq " + std::to_string(victim) + " layer 1 value position " +
                                 std::to_string(position) + " head 1 dim 3"),
            std::string::npos)
      << c.first_problem;
}

// Faults everywhere (20,000 steps): every 10 steps one kind of the cache's backend calls (copy,
// launch, event, sync in turn) is armed to fail within its next 30 calls, and every kind of the
// workload's own I/O backend too. One cache fault at a time: a second fault while the cache takes
// the first one back (its syncs and copies) would leave it unusable, which the workload reports as
// an error. Every fault is tolerated (the failed call changed nothing, so the workload retries or
// moves on) and still every verified byte matches the model.
TEST_P(KvCacheRandomized, InjectedFaultsLoseNothing) {
  std::unique_ptr<Backend> inner = testing::make_backend(kind());
  ASSERT_NE(inner, nullptr);
  FaultInjectionBackend cache_backend(*inner);
  FaultInjectionBackend io_backend(*inner);
  WorkloadOptions options;
  options.seed = 11;
  options.backend = &cache_backend;
  options.io_backend = &io_backend;
  options.tolerate_injected_faults = true;
  std::unique_ptr<KvWorkload> w = make_workload(options);
  ASSERT_NE(w, nullptr);
  const FaultKind kinds[] = {FaultKind::kCopy, FaultKind::kLaunch, FaultKind::kEvent,
                             FaultKind::kSync, FaultKind::kQuery};
  std::mt19937_64 rng(11);
  const int64_t steps = std::min<int64_t>(steps_from_env(), 20000);
  for (int64_t done = 0; done < steps && !w->has_problem(); done += 10) {
    cache_backend.disarm_all();
    cache_backend.fail_nth(kinds[(done / 10) % std::size(kinds)],
                           1 + static_cast<int64_t>(rng() % 30));
    for (FaultKind kind : kinds) {
      if (!io_backend.armed(kind)) io_backend.fail_nth(kind, 1 + static_cast<int64_t>(rng() % 30));
    }
    w->run(10);
  }
  cache_backend.disarm_all();
  io_backend.disarm_all();
  w->verify_all();
  const WorkloadCounters& c = w->counters();
  expect_clean(c);
  EXPECT_GT(c.verified_sequences, steps / 50) << describe(c);
  // Every fault of the workload's own I/O reaches it; the cache absorbs some of its own (a
  // failed event query is retried later, say) and returns the others.
  EXPECT_GE(c.injected_faults, io_backend.injected()) << describe(c);
  EXPECT_LE(c.injected_faults, cache_backend.injected() + io_backend.injected()) << describe(c);
  EXPECT_GT(c.injected_faults - io_backend.injected(), steps / 40) << describe(c);
  EXPECT_GT(cache_backend.injected(), steps / 40) << describe(c);
  EXPECT_GT(io_backend.injected(), steps / 50) << describe(c);
}

// Without tolerance an injected fault is an error, named in first_problem, and the run stops.
TEST_P(KvCacheRandomized, UntoleratedFaultIsAnError) {
  std::unique_ptr<Backend> inner = testing::make_backend(kind());
  ASSERT_NE(inner, nullptr);
  FaultInjectionBackend cache_backend(*inner);
  WorkloadOptions options;
  options.seed = 12;
  options.backend = &cache_backend;
  std::unique_ptr<KvWorkload> w = make_workload(options);
  ASSERT_NE(w, nullptr);
  cache_backend.fail_nth(FaultKind::kLaunch, 50);
  w->run(2000);
  const WorkloadCounters& c = w->counters();
  EXPECT_EQ(c.errors, 1) << describe(c);
  EXPECT_LT(c.ops, 2000);
  EXPECT_EQ(c.injected_faults, 0);
  EXPECT_NE(c.first_problem.find("injected fault: launch"), std::string::npos) << c.first_problem;
}

}  // namespace
}  // namespace pagedkv
