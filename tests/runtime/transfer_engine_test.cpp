// The transfer engine: run merging, bit-exact round trips between tiers, and event ordering
// against the compute stream when the copy worker is slow.
#include "runtime/transfer_engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "ops/launch_shape.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "support/backend_test.hpp"
#include "support/forwarding_backend.hpp"
#include "support/gated_transfers.hpp"
#include "support/status_matchers.hpp"
#include "support/stream_gate.hpp"

namespace pagedkv::runtime {
namespace {

using pagedkv::testing::BackendTest;

BlockMove offload(int32_t device_block, int32_t host_block) {
  return BlockMove{Tier::kDevice, device_block, Tier::kHost, host_block};
}
BlockMove restore(int32_t host_block, int32_t device_block) {
  return BlockMove{Tier::kHost, host_block, Tier::kDevice, device_block};
}

TEST(MergeRuns, MergesOnlyConsecutiveSourceAndDestinationInListOrder) {
  const std::vector<BlockMove> moves = {offload(0, 5),  offload(1, 6),
                                        offload(2, 7),  offload(4, 8),  // source gap
                                        offload(5, 10),                 // destination gap
                                        restore(3, 9),                  // direction change
                                        restore(4, 10), offload(6, 11)};
  const std::vector<CopyRun> runs = merge_runs(moves);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].src_block, 0);
  EXPECT_EQ(runs[0].dst_block, 5);
  EXPECT_EQ(runs[0].num_blocks, 3);
  EXPECT_EQ(runs[1].src_block, 4);
  EXPECT_EQ(runs[1].num_blocks, 1);
  EXPECT_EQ(runs[2].src_block, 5);
  EXPECT_EQ(runs[2].dst_block, 10);
  EXPECT_EQ(runs[3].src_tier, Tier::kHost);
  EXPECT_EQ(runs[3].src_block, 3);
  EXPECT_EQ(runs[3].dst_block, 9);
  EXPECT_EQ(runs[3].num_blocks, 2);
  EXPECT_EQ(runs[4].src_tier, Tier::kDevice);
  EXPECT_EQ(runs[4].num_blocks, 1);
  EXPECT_TRUE(merge_runs({}).empty());
}

// Pools plus a host mirror of what each block should hold.
class Pools {
 public:
  Pools(Backend& backend, int64_t device_blocks, int64_t host_blocks, int64_t block_bytes)
      : backend_(backend), block_bytes_(block_bytes) {
    pools_.block_bytes = block_bytes;
    pools_.device_blocks = device_blocks;
    pools_.host_blocks = host_blocks;
    pools_.device = *backend.allocate_device(static_cast<size_t>(device_blocks * block_bytes));
    pools_.host = *backend.allocate_pinned(static_cast<size_t>(host_blocks * block_bytes));
  }
  ~Pools() {
    backend_.free_device(pools_.device);
    backend_.free_pinned(pools_.host);
  }
  const TierPools& pools() const { return pools_; }
  /// The pools with the host pool mapped for the copy kernel (as KvCache sets them up).
  TierPools mapped_pools() const {
    TierPools p = pools_;
    StatusOr<void*> mapped = backend_.mapped_device_pointer(pools_.host);
    EXPECT_OK(mapped);
    p.host_mapped = mapped.ok() ? *mapped : nullptr;
    return p;
  }

  /// Fills device block `b` with bytes derived from `seed` (blocking).
  std::vector<uint8_t> fill_device(int64_t b, uint32_t seed) {
    std::vector<uint8_t> bytes(static_cast<size_t>(block_bytes_));
    std::mt19937 rng(seed);
    for (auto& x : bytes) x = static_cast<uint8_t>(rng() | 1);  // never zero
    EXPECT_OK(backend_.copy_async(device_block(b), bytes.data(), bytes.size(),
                                  CopyKind::kHostToDevice, Stream{}));
    EXPECT_OK(backend_.synchronize_stream(Stream{}));
    return bytes;
  }
  std::vector<uint8_t> read(Tier tier, int64_t b) {
    std::vector<uint8_t> bytes(static_cast<size_t>(block_bytes_));
    EXPECT_OK(backend_.synchronize_stream(Stream{}));
    void* src = tier == Tier::kDevice ? device_block(b) : host_block(b);
    EXPECT_OK(backend_.copy_async(
        bytes.data(), src, bytes.size(),
        tier == Tier::kDevice ? CopyKind::kDeviceToHost : CopyKind::kHostToHost, Stream{}));
    EXPECT_OK(backend_.synchronize_stream(Stream{}));
    return bytes;
  }
  char* device_block(int64_t b) const {
    return static_cast<char*>(pools_.device) + b * block_bytes_;
  }
  char* host_block(int64_t b) const { return static_cast<char*>(pools_.host) + b * block_bytes_; }

 private:
  Backend& backend_;
  int64_t block_bytes_;
  TierPools pools_;
};

template <typename Tag>
class TransferEngineTest : public BackendTest<Tag> {};
TYPED_TEST_SUITE(TransferEngineTest, pagedkv::testing::AllBackends, pagedkv::testing::BackendName);

TYPED_TEST(TransferEngineTest, RoundTripDeviceHostDeviceIsBitExact) {
  Pools p(this->backend(), 16, 8, 4096 + 64);
  auto engine = TransferEngine::create(this->backend(), p.pools());
  ASSERT_OK(engine);
  std::vector<std::vector<uint8_t>> original;
  const int32_t sources[] = {2, 3, 4, 9, 11};
  for (int32_t b : sources) original.push_back(p.fill_device(b, 100u + b));

  auto out = (*engine)->submit(
      {offload(2, 0), offload(3, 1), offload(4, 2), offload(9, 5), offload(11, 7)}, Stream{});
  ASSERT_OK(out);
  EXPECT_EQ((*engine)->copies_issued(), 1);   // one batch
  EXPECT_EQ((*engine)->regions_issued(), 3);  // 2..4 merge into one run
  ASSERT_OK((*engine)->order_after(*out, Stream{}));
  for (int32_t b : sources) p.fill_device(b, 7u);  // overwrite the originals after the copy

  auto back = (*engine)->submit(
      {restore(0, 12), restore(1, 13), restore(2, 14), restore(5, 1), restore(7, 0)}, Stream{});
  ASSERT_OK(back);
  ASSERT_OK((*engine)->wait(*back));
  EXPECT_TRUE(*(*engine)->is_complete(*out));
  const int32_t targets[] = {12, 13, 14, 1, 0};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(p.read(Tier::kDevice, targets[i]), original[i]) << "block " << sources[i];
  }
  EXPECT_EQ((*engine)->bytes_moved(), 10 * (4096 + 64));
}

TYPED_TEST(TransferEngineTest, InvalidMovesQueueNothing) {
  Pools p(this->backend(), 4, 2, 512);
  auto engine = TransferEngine::create(this->backend(), p.pools());
  ASSERT_OK(engine);
  const std::vector<uint8_t> before = p.fill_device(0, 1);
  auto s1 = (*engine)->submit({offload(0, 0), offload(1, 2)}, Stream{});  // host block 2 of 2
  EXPECT_EQ(s1.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(s1.status().message().find("host block 2"), std::string::npos) << s1.status().message();
  auto s2 = (*engine)->submit({restore(0, -1)}, Stream{});
  EXPECT_EQ(s2.status().code(), StatusCode::kOutOfRange);
  auto s3 = (*engine)->submit({BlockMove{Tier::kDevice, 1, Tier::kDevice, 1}}, Stream{});
  EXPECT_EQ(s3.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->copies_issued(), 0);
  EXPECT_EQ(p.read(Tier::kDevice, 0), before);
  EXPECT_EQ((*engine)->is_complete(1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*engine)->order_after(0, Stream{}).code(), StatusCode::kNotFound);
}

TEST(TransferEngineCreate, RejectsBadPools) {
  auto backend = create_cpu_backend();
  TierPools pools;
  EXPECT_EQ(TransferEngine::create(*backend, pools).status().code(), StatusCode::kInvalidArgument);
  int dummy = 0;
  pools.block_bytes = 64;
  pools.device = &dummy;
  pools.device_blocks = 1;
  pools.host_blocks = 3;  // but no host pointer
  EXPECT_EQ(TransferEngine::create(*backend, pools).status().code(), StatusCode::kInvalidArgument);
}

// With a slow copy worker: offload a block, immediately reuse the device block for new writes
// (ordered after the copy by order_after, no host blocking), then restore. Both the new writes
// and the offloaded bytes must survive.
void offload_then_reuse(bool ordered, bool* offloaded_intact, bool* new_write_intact) {
  // The offload's copy is held at a gate until the reuse is queued: without the ordering the
  // write runs first, every time.
  testing::GatedTransfers backend(create_cpu_backend());
  const int64_t block_bytes = 1024;
  Pools p(backend, 4, 2, block_bytes);
  auto engine = TransferEngine::create(backend, p.pools());
  ASSERT_OK(engine);
  const std::vector<uint8_t> original = p.fill_device(1, 42);

  backend.arm();
  auto ticket = (*engine)->submit({offload(1, 0)}, Stream{});
  ASSERT_OK(ticket);
  EXPECT_FALSE(*(*engine)->is_complete(*ticket));  // the copy is held
  if (ordered) {
    ASSERT_OK((*engine)->order_after(*ticket, Stream{}));
  }
  // Reuse device block 1 for another sequence's writes, on the compute (default) stream.
  const kernels::FillBody write{reinterpret_cast<uint32_t*>(p.device_block(1)), 0x5a5a5a5au};
  ASSERT_OK(backend.launch({KernelId::kFill, &write, sizeof(write), block_bytes / 4}, Stream{}));
  if (!ordered) {
    ASSERT_OK(backend.synchronize_stream(Stream{}));  // the write lands first
  }
  backend.release();

  auto back = (*engine)->submit({restore(0, 3)}, Stream{});
  ASSERT_OK(back);
  ASSERT_OK((*engine)->order_after(*back, Stream{}));
  *offloaded_intact = p.read(Tier::kDevice, 3) == original;
  *new_write_intact = p.read(Tier::kDevice, 1) == std::vector<uint8_t>(block_bytes, 0x5a);
}

TEST(TransferOrdering, ReusedDeviceBlockIsWrittenOnlyAfterTheOffloadCopy) {
  bool offloaded_intact = false, new_write_intact = false;
  offload_then_reuse(/*ordered=*/true, &offloaded_intact, &new_write_intact);
  EXPECT_TRUE(offloaded_intact) << "the offloaded bytes were overwritten before the copy read them";
  EXPECT_TRUE(new_write_intact);
}

// The same sequence without order_after loses the offloaded bytes: this is what the ordering
// above prevents, and shows that the test above can fail.
TEST(TransferOrdering, WithoutOrderingTheReuseRacesAheadOfTheCopy) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a deliberate data race: ThreadSanitizer rightly reports it";
#endif
  bool offloaded_intact = true, new_write_intact = false;
  offload_then_reuse(/*ordered=*/false, &offloaded_intact, &new_write_intact);
  EXPECT_FALSE(offloaded_intact);
}

// The engine keeps each device block's last reading and writing job (BlockHazards): a stream
// ordered before the use or reuse of a block the job does not touch waits for nothing, one
// ordered before a block it touches waits for the job, and the entries go once ordered or once
// the job completed. Copies sleep 150 ms; an event on the ordered stream shows whether it waits.
TEST(TransferOrdering, UsesAndReusesWaitOnlyForTheJobsTouchingTheirBlocks) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::milliseconds(150);
  options.run_inline_when_idle = false;
  auto backend = create_cpu_backend(options);
  Pools p(*backend, 8, 4, 1024);
  auto engine = TransferEngine::create(*backend, p.pools());
  ASSERT_OK(engine);
  TransferEngine& e = **engine;
  auto stream = backend->create_stream();
  ASSERT_OK(stream);
  // Whether work queued on the stream now completes while `ticket` is still in flight.
  auto runs_ahead = [&](TransferTicket ticket) {
    auto ev = backend->create_event();
    EXPECT_OK(ev);
    EXPECT_OK(backend->record_event(*ev, *stream));
    EXPECT_OK(backend->synchronize_event(*ev));
    const bool ahead = !*e.is_complete(ticket);
    backend->destroy_event(*ev);
    return ahead;
  };

  // Job 1 reads device block 1 (an offload) and writes device block 5 (a restore).
  auto job = e.submit({offload(1, 0), restore(2, 5)}, Stream{});
  ASSERT_OK(job);
  EXPECT_EQ(e.blocks_pending(0, /*read=*/true), 1);
  EXPECT_EQ(e.blocks_pending(0, /*read=*/false), 1);
  const int32_t other_blocks[] = {0, 2, -1, 7};
  const int64_t other_slots[] = {3 * 4, 6 * 4 + 1, -1};  // blocks 3 and 6 (4-token blocks)
  ASSERT_OK(e.order_block_use(0, other_blocks, 4, *stream));
  ASSERT_OK(e.order_block_reuse(0, other_slots, 3, 4, *stream));
  const int32_t block_read[] = {1};
  ASSERT_OK(e.order_block_use(0, block_read, 1, *stream));  // reads wait for writes only
  EXPECT_TRUE(runs_ahead(*job)) << "the stream waited for a job that touches none of its blocks";

  const int32_t restored[] = {5};
  ASSERT_OK(e.order_block_use(0, restored, 1, *stream));
  EXPECT_FALSE(runs_ahead(*job)) << "a use of the restored block ran before the restore";
  EXPECT_EQ(e.blocks_pending(0, false), 0);

  auto second = e.submit({offload(3, 1)}, Stream{});
  ASSERT_OK(second);
  const int64_t reused[] = {3 * 4 + 2};
  ASSERT_OK(e.order_block_reuse(0, reused, 1, 4, *stream));
  EXPECT_FALSE(runs_ahead(*second)) << "a write into the offloaded block ran before the offload";
  // Job 1 had completed (its read of block 1 retired) and job 2's read was ordered: no entry.
  EXPECT_EQ(e.blocks_pending(0, true), 0);
  ASSERT_OK(e.synchronize());
  backend->destroy_stream(*stream);
}

// N distinct blocks out of [0, limit), in random order, no two consecutive in list order (so
// no run merges and every block is its own region).
std::vector<int32_t> scattered_blocks(int32_t n, int32_t limit, std::mt19937& rng) {
  std::vector<int32_t> all(static_cast<size_t>(limit));
  std::iota(all.begin(), all.end(), 0);
  for (;;) {
    std::shuffle(all.begin(), all.end(), rng);
    bool merges = false;
    for (int32_t i = 1; i < n; ++i) merges |= all[i] == all[i - 1] + 1;
    if (!merges) return std::vector<int32_t>(all.begin(), all.begin() + n);
  }
}

TYPED_TEST(TransferEngineTest, ScatteredOffloadAndRestoreAreOneBatchedCopyPerDirection) {
  FaultInjectionBackend fi(this->backend());
  const int32_t n = 37;
  const int64_t block_bytes = 1000 + 24;  // not a power of two
  Pools p(fi, 96, 64, block_bytes);
  auto engine = TransferEngine::create(fi, p.pools());
  ASSERT_OK(engine);
  std::mt19937 rng(77);
  const std::vector<int32_t> devices = scattered_blocks(n, 96, rng);
  const std::vector<int32_t> hosts = scattered_blocks(n, 64, rng);
  std::vector<std::vector<uint8_t>> original;
  for (int32_t i = 0; i < n; ++i) original.push_back(p.fill_device(devices[i], 500u + i));

  fi.record_copies(true);
  fi.reset_counts();
  std::vector<BlockMove> offloads;
  for (int32_t i = 0; i < n; ++i) offloads.push_back(offload(devices[i], hosts[i]));
  auto out = (*engine)->submit(offloads, Stream{});
  ASSERT_OK(out);
  ASSERT_OK((*engine)->order_after(*out, Stream{}));
  std::vector<CopyCall> calls = fi.copy_calls();
  EXPECT_EQ(fi.count(FaultKind::kCopy), 1) << "one batched copy for the offload, not one per block";
  for (int32_t b : devices) p.fill_device(b, 9u);  // the compute stream reuses the blocks

  // Back into other scattered device blocks.
  std::vector<int32_t> targets = scattered_blocks(n, 96, rng);
  std::vector<BlockMove> restores;
  for (int32_t i = 0; i < n; ++i) restores.push_back(restore(hosts[i], targets[i]));
  fi.reset_counts();
  auto back = (*engine)->submit(restores, Stream{});
  ASSERT_OK(back);
  ASSERT_OK((*engine)->wait(*back));
  EXPECT_EQ(fi.count(FaultKind::kCopy), 1) << "one batched copy for the restore";
  for (const CopyCall& c : fi.copy_calls()) calls.push_back(c);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0].batched);
  EXPECT_EQ(calls[0].kind, CopyKind::kDeviceToHost);
  EXPECT_EQ(calls[0].regions, static_cast<size_t>(n));
  EXPECT_EQ(calls[0].bytes, static_cast<size_t>(n * block_bytes));
  EXPECT_TRUE(calls[1].batched);
  EXPECT_EQ(calls[1].kind, CopyKind::kHostToDevice);
  EXPECT_EQ(calls[1].regions, static_cast<size_t>(n));
  // The two directions use the engine's two streams, which are distinct.
  EXPECT_EQ(calls[0].stream, (*engine)->device_to_host_stream());
  EXPECT_EQ(calls[1].stream, (*engine)->host_to_device_stream());
  EXPECT_NE(calls[0].stream, calls[1].stream);
  for (int32_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.read(Tier::kDevice, targets[i]), original[i]) << "block " << devices[i];
  }
  EXPECT_EQ((*engine)->copies_issued(), 2);
  EXPECT_EQ((*engine)->regions_issued(), 2 * n);
}

TYPED_TEST(TransferEngineTest, EvictAndRestoreJobIsOneBatchPerDirectionAndKeepsEveryByte) {
  // The shape reserve() makes: offload a victim, restore a block into the slot it freed, again
  // and again. Both directions batch; the restores follow the offloads that free their slots.
  FaultInjectionBackend fi(this->backend());
  const int32_t n = 12;
  const int64_t block_bytes = 777;
  Pools p(fi, 32, 64, block_bytes);
  auto engine = TransferEngine::create(fi, p.pools());
  ASSERT_OK(engine);
  std::vector<std::vector<uint8_t>> victims, restored;
  std::vector<BlockMove> moves;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t slot = 2 * i + 1;  // device slots 1, 3, 5, ...
    victims.push_back(p.fill_device(slot, 900u + i));
    // Put the block to restore into host slot 40 + i (through device block 0).
    restored.push_back(p.fill_device(0, 1900u + i));
    auto staged = (*engine)->submit({offload(0, 40 + i)}, Stream{});
    ASSERT_OK(staged);
    ASSERT_OK((*engine)->wait(*staged));
    moves.push_back(offload(slot, 2 * i));   // victim out to host slot 2i
    moves.push_back(restore(40 + i, slot));  // restored block into the freed device slot
  }
  fi.record_copies(true);
  fi.reset_counts();
  int64_t queued = -1;
  auto job = (*engine)->submit(moves, Stream{}, &queued);
  ASSERT_OK(job);
  EXPECT_EQ(queued, 2 * n);
  ASSERT_OK((*engine)->wait(*job));
  const std::vector<CopyCall> calls = fi.copy_calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].kind, CopyKind::kDeviceToHost);
  EXPECT_EQ(calls[1].kind, CopyKind::kHostToDevice);
  EXPECT_NE(calls[0].stream, calls[1].stream);
  for (int32_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.read(Tier::kHost, 2 * i), victims[i]) << "victim " << i;
    EXPECT_EQ(p.read(Tier::kDevice, 2 * i + 1), restored[i]) << "restored " << i;
  }
}

TYPED_TEST(TransferEngineTest, ADependencyCycleSplitsABatchAndKeepsEveryByte) {
  // m1 reads host 3 before m2 writes it (to-host after to-device); m3 writes device 5 after m0
  // reads it (to-device after to-host): one batch per direction cannot hold both orders.
  FaultInjectionBackend fi(this->backend());
  Pools p(fi, 16, 16, 512);
  auto engine = TransferEngine::create(fi, p.pools());
  ASSERT_OK(engine);
  const std::vector<uint8_t> d5 = p.fill_device(5, 1), d4 = p.fill_device(4, 2);
  const std::vector<uint8_t> h3 = p.fill_device(0, 3);
  const std::vector<uint8_t> h7 = p.fill_device(1, 4);
  auto staged = (*engine)->submit({offload(0, 3), offload(1, 7)}, Stream{});
  ASSERT_OK(staged);
  ASSERT_OK((*engine)->wait(*staged));
  fi.record_copies(true);
  fi.reset_counts();
  auto job =
      (*engine)->submit({offload(5, 1), restore(3, 9), offload(4, 3), restore(7, 5)}, Stream{});
  ASSERT_OK(job);
  ASSERT_OK((*engine)->wait(*job));
  EXPECT_EQ(fi.copy_calls().size(), 3u);
  EXPECT_EQ(p.read(Tier::kHost, 1), d5);
  EXPECT_EQ(p.read(Tier::kDevice, 9), h3);
  EXPECT_EQ(p.read(Tier::kHost, 3), d4);
  EXPECT_EQ(p.read(Tier::kDevice, 5), h7);
}

TYPED_TEST(TransferEngineTest, AFailedBatchReportsTheQueuedPrefix) {
  FaultInjectionBackend fi(this->backend());
  Pools p(fi, 16, 16, 256);
  auto engine = TransferEngine::create(fi, p.pools());
  ASSERT_OK(engine);
  const std::vector<uint8_t> d0 = p.fill_device(0, 5), d2 = p.fill_device(2, 6);
  // Independent moves: the offloads go first (copy #1), then the restores (copy #2).
  const std::vector<BlockMove> moves = {offload(0, 0), offload(2, 1), restore(4, 6), restore(5, 7)};
  for (int64_t nth : {1, 2}) {
    fi.fail_nth(FaultKind::kCopy, nth);
    int64_t queued = -1;
    auto job = (*engine)->submit(moves, Stream{}, &queued);
    EXPECT_EQ(job.status().code(), StatusCode::kInternal);
    EXPECT_NE(job.status().message().find("copy_batch"), std::string::npos);
    EXPECT_EQ(queued, nth == 1 ? 0 : 2) << "fault on copy #" << nth;
    ASSERT_OK((*engine)->synchronize());
  }
  // The second attempt's offloads ran.
  EXPECT_EQ(p.read(Tier::kHost, 0), d0);
  EXPECT_EQ(p.read(Tier::kHost, 1), d2);
}

// ---------------------------------------------------------------- the copy kernel path

// Forces the copy kernel (any block is below the threshold) or the batched copy (threshold 0).
constexpr int64_t kAlwaysKernel = int64_t{1} << 40;
constexpr int64_t kNeverKernel = 0;

StatusOr<std::unique_ptr<TransferEngine>> make_engine(Backend& backend, const Pools& p,
                                                      int64_t kernel_block_bytes) {
  TransferOptions options;
  options.kernel_block_bytes = kernel_block_bytes;
  return TransferEngine::create(backend, p.mapped_pools(), options);
}

// Several groups' pools in one engine (a cache whose groups share the blocks): a job that
// interleaves the groups' moves lands each in its own pools, whichever path each group takes
// (both kernels, both batched copies, or one of each when the threshold lies between their
// block sizes), and a batched copy merges each group's consecutive blocks into one run.
TEST(TransferEngineGroups, InterleavedMovesLandInTheirGroupsPools) {
  auto backend = create_cpu_backend();
  constexpr int64_t kBlocks = 6;
  const int64_t bytes[2] = {4096 + 64, 1024 + 32};
  for (const int64_t threshold : {kAlwaysKernel, kNeverKernel, int64_t{2048}}) {
    SCOPED_TRACE("kernel threshold " + std::to_string(threshold));
    Pools a(*backend, kBlocks, kBlocks, bytes[0]), b(*backend, kBlocks, kBlocks, bytes[1]);
    Pools* pools[2] = {&a, &b};
    TransferOptions options;
    options.kernel_block_bytes = threshold;
    auto engine = TransferEngine::create(*backend, {a.mapped_pools(), b.mapped_pools()}, options);
    ASSERT_OK(engine);
    EXPECT_EQ((*engine)->uses_kernel(), threshold != kNeverKernel);
    std::vector<uint8_t> want[2][3];
    std::vector<BlockMove> out;
    for (int32_t i = 0; i < 3; ++i) {
      for (int32_t g = 0; g < 2; ++g) {
        want[g][i] = pools[g]->fill_device(i, static_cast<uint32_t>(17 * g + i));
        BlockMove m = offload(i, i + 2);
        m.group = g;
        out.push_back(m);
      }
    }
    auto t = (*engine)->submit(out, Stream{});
    ASSERT_OK(t);
    ASSERT_OK((*engine)->wait(*t));
    if (threshold == kNeverKernel) {
      EXPECT_EQ((*engine)->regions_issued(), 2) << "one run per group";
    }
    std::vector<BlockMove> back;
    for (int32_t i = 0; i < 3; ++i) {
      for (int32_t g = 0; g < 2; ++g) {
        EXPECT_EQ(pools[g]->read(Tier::kHost, i + 2), want[g][i]) << "group " << g << " " << i;
        BlockMove m = restore(i + 2, 5 - i);
        m.group = g;
        back.push_back(m);
      }
    }
    t = (*engine)->submit(back, Stream{});
    ASSERT_OK(t);
    ASSERT_OK((*engine)->wait(*t));
    for (int32_t i = 0; i < 3; ++i) {
      for (int32_t g = 0; g < 2; ++g) {
        EXPECT_EQ(pools[g]->read(Tier::kDevice, 5 - i), want[g][i]) << "group " << g << " " << i;
      }
    }
    // A move of a group the engine does not hold, or past that group's own pool, is refused
    // before anything is queued.
    const std::vector<uint8_t> before = a.read(Tier::kHost, 1);
    BlockMove stray = offload(0, 0);
    stray.group = 2;
    EXPECT_EQ((*engine)->submit({offload(1, 1), stray}, Stream{}).status().code(),
              StatusCode::kOutOfRange);
    BlockMove past = offload(0, kBlocks);  // one past group 1's host pool
    past.group = 1;
    EXPECT_EQ((*engine)->submit({offload(1, 1), past}, Stream{}).status().code(),
              StatusCode::kOutOfRange);
    ASSERT_OK((*engine)->synchronize());
    EXPECT_EQ(a.read(Tier::kHost, 1), before);
  }
}

TEST(TransferEngineCreate, ChoosesThePathByBlockBytesAndMapping) {
  auto backend = create_cpu_backend();
  Pools p(*backend, 4, 4, 4096);
  auto at = [&](const TierPools& pools, int64_t threshold) {
    TransferOptions options;
    options.kernel_block_bytes = threshold;
    auto e = TransferEngine::create(*backend, pools, options);
    EXPECT_OK(e);
    return e.ok() && (*e)->uses_kernel();
  };
  EXPECT_TRUE(at(p.mapped_pools(), 4097));
  EXPECT_FALSE(at(p.mapped_pools(), 4096)) << "the threshold is exclusive";
  EXPECT_FALSE(at(p.mapped_pools(), 0));
  EXPECT_FALSE(at(p.pools(), kAlwaysKernel)) << "an unmapped host pool takes the batched copy";
  TransferOptions negative;
  negative.kernel_block_bytes = -1;
  EXPECT_EQ(TransferEngine::create(*backend, p.mapped_pools(), negative).status().code(),
            StatusCode::kInvalidArgument);
  TierPools no_host = p.mapped_pools();
  no_host.host = nullptr;
  no_host.host_blocks = 0;
  EXPECT_EQ(TransferEngine::create(*backend, no_host).status().code(),
            StatusCode::kInvalidArgument);
}

// A random job list of every move kind, with blocks reused within and across jobs (so that
// batches are cut and lanes wait on each other), applied in list order to a host model of both
// pools.
std::vector<BlockMove> random_job(std::mt19937& rng, int32_t device_blocks, int32_t host_blocks,
                                  std::vector<std::vector<uint8_t>>& device_model,
                                  std::vector<std::vector<uint8_t>>& host_model) {
  std::vector<BlockMove> moves;
  const int n = 1 + static_cast<int>(rng() % 40);
  for (int i = 0; i < n; ++i) {
    BlockMove m;
    const uint32_t r = rng() % 20;  // mostly offloads and restores, as the control plane makes
    m.src_tier = r < 9 || r == 18 ? Tier::kDevice : Tier::kHost;
    m.dst_tier = r < 9 || r == 19 ? Tier::kHost : Tier::kDevice;
    if (r == 18) m.dst_tier = Tier::kDevice;
    if (r == 19) m.src_tier = Tier::kHost;
    const int32_t src_limit = m.src_tier == Tier::kDevice ? device_blocks : host_blocks;
    const int32_t dst_limit = m.dst_tier == Tier::kDevice ? device_blocks : host_blocks;
    m.src_block = static_cast<int32_t>(rng() % static_cast<uint32_t>(src_limit));
    do {
      m.dst_block = static_cast<int32_t>(rng() % static_cast<uint32_t>(dst_limit));
    } while (m.src_tier == m.dst_tier && m.src_block == m.dst_block);
    auto& src = m.src_tier == Tier::kDevice ? device_model : host_model;
    auto& dst = m.dst_tier == Tier::kDevice ? device_model : host_model;
    dst[static_cast<size_t>(m.dst_block)] = src[static_cast<size_t>(m.src_block)];
    moves.push_back(m);
  }
  return moves;
}

// Runs the same random jobs through an engine with `threshold` on fresh pools filled from
// `seed`; returns every block of both pools (device blocks first) and checks them against the
// model.
std::vector<std::vector<uint8_t>> run_random_jobs(Backend& backend, int64_t threshold,
                                                  int64_t block_bytes, bool expect_kernel,
                                                  int64_t* kernels, int64_t* copies) {
  constexpr int32_t kDevice = 48, kHost = 40;
  Pools p(backend, kDevice, kHost, block_bytes);
  std::vector<std::vector<uint8_t>> device_model, host_model;
  for (int32_t b = 0; b < kDevice; ++b) device_model.push_back(p.fill_device(b, 1000u + b));
  for (int32_t b = 0; b < kHost; ++b) {
    std::vector<uint8_t> bytes = p.fill_device(0, 5000u + b);
    std::memcpy(p.host_block(b), bytes.data(), bytes.size());
    host_model.push_back(std::move(bytes));
  }
  device_model[0] = p.read(Tier::kDevice, 0);
  auto engine = make_engine(backend, p, threshold);
  EXPECT_OK(engine);
  if (!engine.ok()) return {};
  EXPECT_EQ((*engine)->uses_kernel(), expect_kernel);
  std::mt19937 rng(2026);
  TransferTicket last = 0;
  for (int job = 0; job < 60; ++job) {
    auto t = (*engine)->submit(random_job(rng, kDevice, kHost, device_model, host_model), Stream{});
    EXPECT_OK(t);
    if (t.ok()) last = *t;
  }
  EXPECT_OK((*engine)->wait(last));
  EXPECT_OK((*engine)->synchronize());
  *kernels = (*engine)->kernels_issued();
  *copies = (*engine)->copies_issued();
  std::vector<std::vector<uint8_t>> all;
  for (int32_t b = 0; b < kDevice; ++b) {
    all.push_back(p.read(Tier::kDevice, b));
    EXPECT_EQ(all.back(), device_model[static_cast<size_t>(b)]) << "device block " << b;
  }
  for (int32_t b = 0; b < kHost; ++b) {
    all.push_back(p.read(Tier::kHost, b));
    EXPECT_EQ(all.back(), host_model[static_cast<size_t>(b)]) << "host block " << b;
  }
  return all;
}

TYPED_TEST(TransferEngineTest, KernelAndBatchedPathsLeaveBitIdenticalPools) {
  // Odd block sizes give the kernel 4-, 8- and 16-byte vectors.
  for (int64_t block_bytes : {int64_t{1028}, int64_t{2056}, int64_t{4096 + 16}}) {
    SCOPED_TRACE("block bytes " + std::to_string(block_bytes));
    int64_t kernels = 0, copies = 0;
    const auto batched = run_random_jobs(this->backend(), kNeverKernel, block_bytes,
                                         /*expect_kernel=*/false, &kernels, &copies);
    EXPECT_EQ(kernels, 0);
    EXPECT_GE(copies, 60);
    const auto kernel = run_random_jobs(this->backend(), kAlwaysKernel, block_bytes,
                                        /*expect_kernel=*/true, &kernels, &copies);
    EXPECT_EQ(copies, 0);
    EXPECT_GE(kernels, 60);
    ASSERT_EQ(batched.size(), kernel.size());
    for (size_t b = 0; b < batched.size(); ++b) EXPECT_EQ(batched[b], kernel[b]) << "block " << b;
  }
}

// The GPU's launch shape (one vector per index) run on the CPU backend, against the same model,
// with copy kernels that lag (so jobs overlap and pairs buffers are still being read when the
// next jobs are issued).
TEST(TransferEngineKernel, NarrowLaunchShapeWithLaggingCopiesMovesTheSameBytes) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::microseconds(300);
  auto backend = create_cpu_backend(options);
  ops_detail::set_launch_shape_for_testing(ops_detail::LaunchShape::kNarrow);
  int64_t kernels = 0, copies = 0;
  for (int64_t block_bytes : {int64_t{1028}, int64_t{4096 + 16}}) {
    run_random_jobs(*backend, kAlwaysKernel, block_bytes, /*expect_kernel=*/true, &kernels,
                    &copies);
    EXPECT_GE(kernels, 60);
  }
  ops_detail::set_launch_shape_for_testing(ops_detail::LaunchShape::kAuto);
}

TYPED_TEST(TransferEngineTest, KernelPathIsOneLaunchPerDirectionAndNoBlockCopies) {
  FaultInjectionBackend fi(this->backend());
  const int32_t n = 37;
  const int64_t block_bytes = 1000 + 24;
  Pools p(fi, 96, 64, block_bytes);
  auto engine = make_engine(fi, p, kAlwaysKernel);
  ASSERT_OK(engine);
  ASSERT_TRUE((*engine)->uses_kernel());
  std::mt19937 rng(78);
  const std::vector<int32_t> devices = scattered_blocks(n, 96, rng);
  const std::vector<int32_t> hosts = scattered_blocks(n, 64, rng);
  std::vector<std::vector<uint8_t>> victims, restored;
  for (int32_t i = 0; i < n; ++i) victims.push_back(p.fill_device(devices[i], 600u + i));
  // What to restore: host slots 0..n-1 of the mapped pool hold other bytes, written directly.
  std::vector<BlockMove> moves;
  for (int32_t i = 0; i < n; ++i) {
    std::vector<uint8_t> bytes(static_cast<size_t>(block_bytes));
    for (auto& x : bytes) x = static_cast<uint8_t>(rng() | 1);
    restored.push_back(bytes);
  }
  // The eviction shape: offload a victim into a free host slot, restore into the slot it freed.
  const std::vector<int32_t> sources = scattered_blocks(n, 64, rng);
  std::vector<int32_t> free_hosts;
  for (int32_t h = 0; h < 64; ++h) {
    if (std::find(sources.begin(), sources.end(), h) == sources.end()) free_hosts.push_back(h);
  }
  ASSERT_GE(free_hosts.size(), static_cast<size_t>(n - 10));
  const int32_t m = static_cast<int32_t>(std::min<size_t>(free_hosts.size(), n));
  for (int32_t i = 0; i < m; ++i) {
    std::memcpy(p.host_block(sources[i]), restored[i].data(), restored[i].size());
    moves.push_back(offload(devices[i], free_hosts[i]));
    moves.push_back(restore(sources[i], devices[i]));
  }
  fi.record_copies(true);
  fi.record_launches(true);
  fi.reset_counts();
  auto job = (*engine)->submit(moves, Stream{});
  ASSERT_OK(job);
  ASSERT_OK((*engine)->wait(*job));
  EXPECT_EQ(fi.count(FaultKind::kLaunch), 2) << "one copy kernel per direction";
  // No block goes through a copy: the only copies upload each kernel's (src, dst) pairs to
  // device memory, on the kernel's stream just before it (not read over PCIe by every thread).
  const std::vector<CopyCall> copies = fi.copy_calls();
  const std::vector<LaunchCall> launches = fi.launch_calls();
  ASSERT_EQ(copies.size(), 2u);
  ASSERT_EQ(launches.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(copies[i].batched);
    EXPECT_EQ(copies[i].kind, CopyKind::kHostToDevice);
    EXPECT_EQ(copies[i].bytes, static_cast<size_t>(m) * 2 * sizeof(int32_t));
    EXPECT_EQ(copies[i].stream, launches[i].stream);
  }
  EXPECT_EQ((*engine)->kernels_issued(), 2);
  EXPECT_EQ((*engine)->copies_issued(), 0);
  EXPECT_EQ((*engine)->bytes_moved(), 2 * m * block_bytes);
  for (int32_t i = 0; i < m; ++i) {
    EXPECT_EQ(p.read(Tier::kHost, free_hosts[i]), victims[i]) << "victim " << i;
    EXPECT_EQ(p.read(Tier::kDevice, devices[i]), restored[i]) << "restored " << i;
  }
  // A second job reuses the first one's pair buffers once it completed: no allocation.
  fi.reset_counts();
  auto again = (*engine)->submit({offload(devices[0], free_hosts[0])}, Stream{});
  ASSERT_OK(again);
  ASSERT_OK((*engine)->wait(*again));
  EXPECT_EQ(fi.count(FaultKind::kLaunch), 1);
  EXPECT_EQ(fi.count(FaultKind::kAllocation), 0);
  EXPECT_EQ(p.read(Tier::kHost, free_hosts[0]), restored[0]);
}

// The copy kernel must not fill every SM during a PCIe-bound transfer: each launch carries the
// engine's CTA cap, and both copy streams were created with low priority, below compute.
TYPED_TEST(TransferEngineTest, CopyKernelLaunchesAreCappedOnLowPriorityStreams) {
  FaultInjectionBackend fi(this->backend());
  Pools p(fi, 32, 32, 1024);
  auto engine = make_engine(fi, p, kAlwaysKernel);
  ASSERT_OK(engine);
  ASSERT_TRUE((*engine)->uses_kernel());
  EXPECT_EQ(fi.stream_priority((*engine)->device_to_host_stream()), StreamPriority::kLow);
  EXPECT_EQ(fi.stream_priority((*engine)->host_to_device_stream()), StreamPriority::kLow);
  const std::vector<uint8_t> d3 = p.fill_device(3, 21);
  std::vector<uint8_t> h5(1024);
  for (size_t i = 0; i < h5.size(); ++i) h5[i] = static_cast<uint8_t>(i * 13 + 1);
  std::memcpy(p.host_block(5), h5.data(), h5.size());  // pinned: written directly
  fi.record_launches(true);
  auto job = (*engine)->submit({offload(3, 7), restore(5, 9)}, Stream{});
  ASSERT_OK(job);
  ASSERT_OK((*engine)->wait(*job));
  const std::vector<LaunchCall> launches = fi.launch_calls();
  ASSERT_EQ(launches.size(), 2u);
  for (const LaunchCall& l : launches) {
    EXPECT_FALSE(l.host_func);
    EXPECT_EQ(l.kernel, KernelId::kCopyBlocks);
    EXPECT_EQ(l.max_blocks, TransferEngine::kCopyKernelMaxBlocks);
    EXPECT_GT(l.max_blocks, 0);
    EXPECT_EQ(fi.stream_priority(l.stream), StreamPriority::kLow);
  }
  EXPECT_EQ(p.read(Tier::kHost, 7), d3);
  EXPECT_EQ(p.read(Tier::kDevice, 9), h5);
}

TYPED_TEST(TransferEngineTest, AFailedKernelLaunchReportsTheQueuedPrefix) {
  FaultInjectionBackend fi(this->backend());
  Pools p(fi, 16, 16, 256);
  auto engine = make_engine(fi, p, kAlwaysKernel);
  ASSERT_OK(engine);
  const std::vector<uint8_t> d0 = p.fill_device(0, 5), d2 = p.fill_device(2, 6);
  // Independent moves: the offloads go first (launch #1), then the restores (launch #2).
  const std::vector<BlockMove> moves = {offload(0, 0), offload(2, 1), restore(4, 6), restore(5, 7)};
  for (int64_t nth : {1, 2}) {
    fi.fail_nth(FaultKind::kLaunch, nth);
    int64_t queued = -1;
    auto job = (*engine)->submit(moves, Stream{}, &queued);
    EXPECT_EQ(job.status().code(), StatusCode::kInternal);
    EXPECT_NE(job.status().message().find("injected fault: launch"), std::string::npos)
        << job.status().message();
    EXPECT_EQ(queued, nth == 1 ? 0 : 2) << "fault on launch #" << nth;
    ASSERT_OK((*engine)->synchronize());
  }
  // The second attempt's offloads ran.
  EXPECT_EQ(p.read(Tier::kHost, 0), d0);
  EXPECT_EQ(p.read(Tier::kHost, 1), d2);
  // So does a failed allocation of a pairs buffer (a fresh engine has none to reuse).
  auto fresh = make_engine(fi, p, kAlwaysKernel);
  ASSERT_OK(fresh);
  fi.fail_nth(FaultKind::kAllocation, 1);
  int64_t queued = -1;
  auto failed = (*fresh)->submit(moves, Stream{}, &queued);
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("injected fault: allocation"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(queued, 0);
  ASSERT_OK((*fresh)->synchronize());
  const LiveObjects live = fi.live();
  engine->reset();
  fresh->reset();
  EXPECT_LT(fi.live().pinned_allocations, live.pinned_allocations) << "pair buffers freed";
  EXPECT_EQ(fi.live().pinned_allocations, 1) << "only the test's host pool is left";
}

// A CPU backend whose device-to-host batches first wait at a gate on their stream: the
// restores of a job must not overtake the offloads whose device slots they overwrite.
class GatedOffloads final : public testing::ForwardingBackend {
 public:
  explicit GatedOffloads(Backend& inner) : ForwardingBackend(inner) {}
  pagedkv::testing::StreamGate gate;

  std::string description() const override { return "gated " + inner().description(); }
  Status copy_batch(const CopyRegion* r, size_t n, CopyKind kind, Stream s) override {
    if (kind == CopyKind::kDeviceToHost) PAGEDKV_RETURN_IF_ERROR(gate.close(inner(), s));
    return inner().copy_batch(r, n, kind, s);
  }

 private:
};

TEST(TransferOrdering, ARestoreWaitsForTheOffloadThatFreesItsSlot) {
  auto cpu = create_cpu_backend();
  GatedOffloads gated(*cpu);
  Pools p(gated, 4, 4, 2048);
  auto engine = TransferEngine::create(gated, p.pools());
  ASSERT_OK(engine);
  // Host block 1 holds the block to restore (written directly: an offload would be gated).
  std::vector<uint8_t> to_restore(2048);
  std::mt19937 rng(11);
  for (auto& x : to_restore) x = static_cast<uint8_t>(rng() | 1);
  std::memcpy(p.host_block(1), to_restore.data(), to_restore.size());
  const std::vector<uint8_t> victim = p.fill_device(1, 12);

  auto job = (*engine)->submit({offload(1, 2), restore(1, 1)}, Stream{});
  ASSERT_OK(job);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // The offload is held at the gate; the restore into its slot must be held too.
  EXPECT_FALSE(*(*engine)->is_complete(*job));
  std::vector<uint8_t> now(2048);
  std::memcpy(now.data(), p.device_block(1), now.size());  // racy only if the test fails
  EXPECT_EQ(now, victim) << "the restore overwrote a slot the offload had not read yet";
  gated.gate.release();
  ASSERT_OK((*engine)->wait(*job));
  EXPECT_EQ(p.read(Tier::kHost, 2), victim);
  EXPECT_EQ(p.read(Tier::kDevice, 1), to_restore);
}

}  // namespace
}  // namespace pagedkv::runtime
