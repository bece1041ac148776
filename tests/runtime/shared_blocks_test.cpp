// A model's groups in the one KvCache that shares the logical blocks (a ModelKvCache, or a
// KvCache created from a config with groups), case by case; the randomized run is
// model_cache_random_test.cpp's HybridModel. A window group's pages stay
// bounded while the full group grows; each group's rows, slots and pool are its own; bad input
// is a clear error that changes nothing; shapes one cache cannot hold are refused; events name
// their group. check_invariants() after every step. On both backends (runtime_backends.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/model_cache.hpp"
#include "runtime/model_cache_harness.hpp"
#include "runtime/null_storage.hpp"
#include "support/gated_transfers.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;

// testing::two_groups with the window group listed first: layers 1, 3, 5 sliding window 64
// (group 0), 0, 2, 4 full attention (group 1), block 16. The full group is not group 0, so a
// mix-up of group and plane indices shows.
CacheConfig window_first(int64_t full_blocks, int64_t window_pages) {
  CacheConfig c = testing::two_groups(full_blocks, window_pages);
  std::swap(c.groups[0], c.groups[1]);
  return c;
}

constexpr int32_t kWindow = 0;
constexpr int32_t kFull = 1;

std::vector<TokenId> iota_tokens(int64_t n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<TokenId>(i);
  return t;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What a refused call must leave alone: every group's pool bytes, and each sequence's length,
// reservation and blocks in every group.
struct Snapshot {
  ControlStats stats;
  std::vector<std::vector<uint8_t>> pools;
  std::map<SequenceId, std::vector<int64_t>> lengths;  // length, pending
  std::map<SequenceId, std::vector<std::vector<BlockLocation>>> blocks;
  bool operator==(const Snapshot& o) const {
    return stats == o.stats && pools == o.pools && lengths == o.lengths && blocks == o.blocks;
  }
};

class SharedBlocksTest : public testing::ModelCacheHarness {
 protected:
  KvCache& one() { return cache_->cache(); }

  Snapshot snapshot() {
    Snapshot s;
    EXPECT_OK(cache_->synchronize());
    s.stats = one().stats();
    for (int32_t g = 0; g < cache_->num_groups(); ++g) {
      s.pools.push_back(pool_bytes(cache_->device_pool(g)));
      for (const auto& [id, tokens] : ref_) {
        s.blocks[id].push_back(*cache_->block_locations(id, g));
      }
    }
    for (const auto& [id, tokens] : ref_)
      s.lengths[id] = {*cache_->length(id), *cache_->pending(id)};
    return s;
  }

  void expect_refused(const Status& st, StatusCode code, const std::string& text,
                      const Snapshot& before) {
    expect_refusal(st, code, text, snapshot() == before);
  }

  // The one cache of `c` on `backend` (not owned; backend_ must outlive it), offloads and
  // restores by the copy kernel below `kernel_bytes`, and sequence 1 prefilled with 40 tokens
  // (three pages of the window group's four).
  void make_sharing_on(const CacheConfig& c, Backend* backend, int64_t kernel_bytes) {
    ModelKvCacheOptions o;
    o.cache.backend = backend;
    o.cache.transfer_kernel_block_bytes = kernel_bytes;
    auto made = ModelKvCache::create(c, o);
    ASSERT_OK(made);
    cache_ = std::move(made).value();
    config_ = c;
    Status appended;
    ASSERT_EQ(*add_and_prefill(1, iota_tokens(40, 1000), &appended), 0);
    ASSERT_OK(appended);
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, SharedBlocksTest, testing::runtime_backends(),
                         testing::backend_param_name);

// ---------------------------------------------------------------- shape and memory

TEST_P(SharedBlocksTest, OneCacheHoldsEveryGroupsPoolAndRoutesItsLayers) {
  make(window_first(64, 16));
  ASSERT_FALSE(HasFatalFailure());
  KvCache& kv = one();
  EXPECT_EQ(kv.num_groups(), 2);
  EXPECT_EQ(kv.full_group(), kFull);
  EXPECT_EQ(kv.pool_info().device_bytes,
            64 * gconf(kFull).block_bytes() + 16 * gconf(kWindow).block_bytes());
  for (int32_t g : {kWindow, kFull}) {
    EXPECT_EQ(kv.group_config(g).num_device_blocks, g == kFull ? 64 : 16);
    EXPECT_EQ(kv.device_pool(g).num_blocks, g == kFull ? 64 : 16);
  }
  EXPECT_NE(kv.device_pool(kWindow).data, kv.device_pool(kFull).data);
  for (int32_t layer = 0; layer < 6; ++layer) {
    const LayerGroup l = *kv.layer_group(layer);
    EXPECT_EQ(l.group, layer % 2 == 0 ? kFull : kWindow);
    EXPECT_EQ(l.layer, layer / 2);
  }
  EXPECT_EQ(kv.layer_group(6).status().code(), StatusCode::kOutOfRange);
}

// The memory bound, through the one cache: a window-64 group holds at most
// ceil(64 / 16) + 1 pages per sequence while the full group keeps every block, and each
// group's reserved slots land in its own pool.
TEST_P(SharedBlocksTest, WindowGroupHoldsAtMostFivePagesWhileTheFullGroupGrows) {
  make(window_first(64, 16));
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(10, 100), &appended), 0);
  ASSERT_OK(appended);
  int64_t most = 0;
  for (int step = 0; step < 300; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int64_t len = static_cast<int64_t>(ref_[1].size());
    auto slots = cache_->reserve(1, 1);
    ASSERT_OK(slots);
    ASSERT_EQ(slots->size(), 2u);
    for (int32_t g : {kWindow, kFull}) {
      // The slot is in the page the group's table gives for the position.
      const auto blocks = *cache_->block_locations(1, g);
      const int64_t slot = (*slots)[static_cast<size_t>(g)][0];
      EXPECT_EQ(slot, int64_t{blocks[static_cast<size_t>(len / 16)].block} * 16 + len % 16);
    }
    const int64_t window = *cache_->held_blocks(1, kWindow);
    EXPECT_EQ(*cache_->held_blocks(1, kFull), ceil_div(len + 1, 16));
    EXPECT_EQ(window, ceil_div(len + 1, 16) - window_first_block(kWindow, len));
    EXPECT_LE(window, 64 / 16 + 1);
    most = std::max(most, window);
    ASSERT_OK(write_layers(1, {TokenId(1000 + step)}, len));
    ASSERT_OK(cache_->commit(1, {TokenId(1000 + step)}));
    ref_[1].push_back(1000 + step);
    invariants();
    if (step % 50 == 0) {
      EXPECT_EQ(check_gather(1), "");
    }
  }
  EXPECT_EQ(most, 5);
  EXPECT_GT(one().stats().window_released_blocks, 10);
  EXPECT_EQ(check_gather(1), "");
  EXPECT_GT(out_of_range_checks_, 0);
  std::mt19937_64 rng(1);
  EXPECT_EQ(check_view({1}, true, rng), "");
  EXPECT_EQ(check_view({1}, false, rng), "");
}

// ---------------------------------------------------------------- bad input

TEST_P(SharedBlocksTest, BadCallsAreClearErrorsThatChangeNothing) {
  make(window_first(32, 32));
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(40, 10), &appended), 0);
  ASSERT_OK(appended);
  ASSERT_EQ(*add_and_prefill(2, iota_tokens(90, 500), &appended), 0);
  ASSERT_OK(appended);
  ASSERT_OK(cache_->reserve_batch({1, 2}, 1));
  auto batch = cache_->build_batch({1, 2});
  ASSERT_OK(batch);
  ASSERT_EQ(batch->groups.size(), 2u);
  for (int32_t g : {kWindow, kFull}) EXPECT_EQ(batch->groups[static_cast<size_t>(g)].group, g);
  std::vector<uint16_t> rows(2 * 32, 0x3C00);
  DeviceBuffer k(*backend_, rows.size() * 2), v(*backend_, rows.size() * 2);
  k.upload(rows);
  v.upload(rows);
  const Snapshot before = snapshot();

  // The groups' batches swapped: each is this cache's, of the other group.
  ModelBatch swapped = *batch;
  std::swap(swapped.groups[0], swapped.groups[1]);
  expect_refused(cache_->write_kv_batch(swapped, 0, k.data(), v.data(), DType::kFloat16),
                 StatusCode::kInvalidArgument, "not built by this model's build_batch", before);
  expect_refused(cache_->device_view(swapped, kFull).status(), StatusCode::kInvalidArgument,
                 "not built by this model's build_batch", before);
  // The one cache itself: a layer of the other group's batch, the one-batch call, a bad group.
  KvCache& kv = one();
  expect_refused(kv.write_kv_batch(batch->groups[kWindow], 0, k.data(), v.data(), DType::kFloat16),
                 StatusCode::kInvalidArgument, "layer 0 is group 1's; the batch is group 0's",
                 before);
  expect_refused(kv.build_batch({1, 2}).status(), StatusCode::kInvalidArgument, "build_batches",
                 before);
  for (int32_t g : {-1, 2}) {
    expect_refused(kv.block_locations(1, g).status(), StatusCode::kOutOfRange,
                   "outside the cache's 2 groups", before);
    expect_refused(kv.reserved_slots(1, g).status(), StatusCode::kOutOfRange,
                   "outside the cache's 2 groups", before);
  }
  for (int32_t layer : {-1, 6}) {
    const std::string want = "layer " + std::to_string(layer) + " outside the model's 6 layers";
    expect_refused(kv.write_kv(1, layer, k.data(), v.data(), DType::kFloat16),
                   StatusCode::kOutOfRange, want, before);
    expect_refused(
        kv.write_kv_batch(batch->groups[kFull], layer, k.data(), v.data(), DType::kFloat16),
        StatusCode::kOutOfRange, want, before);
    expect_refused(kv.gather_layer(1, layer, k.data(), v.data(), DType::kFloat16,
                                   PackedLayout::kTokenMajor, 39, 1),
                   StatusCode::kOutOfRange, want, before);
  }
  // A window layer's positions the window released are refused; a full layer's are read.
  expect_refused(cache_->gather_layer(2, 1, k.data(), v.data(), DType::kFloat16,
                                      PackedLayout::kTokenMajor, 0, 1),
                 StatusCode::kOutOfRange, "fell out of the sliding window (64 tokens)", before);
  expect_refused(cache_->write_kv(7, 1, k.data(), v.data(), DType::kFloat16), StatusCode::kNotFound,
                 "7", before);
  expect_refused(cache_->commit(1, {1, 2}), StatusCode::kFailedPrecondition, "reserved", before);

  // The batch still works: the step goes through and reads back.
  ASSERT_OK(write_and_commit(*batch, {1, 2}, {77, 77}));
  invariants();
  EXPECT_EQ(check_gather(1), "");
  EXPECT_EQ(check_gather(2), "");
}

TEST_P(SharedBlocksTest, ShapesOneCacheCannotHoldAreRefusedAndTwoFullGroupsAreNot) {
  auto backend = testing::make_backend(kind());
  ASSERT_NE(backend, nullptr);
  const auto create_shared = [&](CacheConfig c, ModelKvCacheOptions o) {
    c.backend = kind();
    o.cache.backend = backend.get();
    return ModelKvCache::create(c, std::move(o)).status();
  };
  // Two full-attention groups are one cache (the second keeps a page per block); so are groups
  // that all have a window (the widest owns the blocks).
  CacheConfig two_full = window_first(8, 8);
  two_full.groups[kWindow].sliding_window = 0;
  EXPECT_OK(create_shared(two_full, {}));
  CacheConfig no_full = window_first(8, 8);
  no_full.groups[kFull].sliding_window = 32;
  EXPECT_OK(create_shared(no_full, {}));
  Status st;
  // Stores come one per group (ModelKvCacheOptions::storage, KvCacheOptions::group_storage),
  // and the group that owns the blocks needs one.
  testing::NullStorage store;
  CacheConfig hosted = window_first(8, 8);
  for (KvGroup& g : hosted.groups) g.num_host_blocks = 8;
  ModelKvCacheOptions window_store_only;
  window_store_only.storage = {&store, nullptr};
  st = create_shared(hosted, window_store_only);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("owns the blocks"), std::string::npos) << st.message();
  KvCacheOptions kv_options;
  kv_options.backend = backend.get();
  kv_options.storage = &store;
  hosted.backend = kind();
  st = KvCache::create(hosted, kv_options).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("group_storage"), std::string::npos) << st.message();
  kv_options.storage = nullptr;
  kv_options.group_storage = {&store};
  st = KvCache::create(hosted, kv_options).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("1 stores for 2 groups"), std::string::npos) << st.message();
  // Without a store, a null entry per group is fine.
  ModelKvCacheOptions nulls;
  nulls.storage = {nullptr, nullptr};
  EXPECT_OK(create_shared(window_first(8, 8), nulls));
}

// ---------------------------------------------------------------- faults

// A fault in the middle of an offload or a restore of a sequence whose blocks and pages are in
// both groups' pools: the failed call returns the injected error and changes nothing in either
// group (every group's block locations and the residency as before, check_invariants()), a
// retry succeeds, and the bytes read back. The n-th call of each kind, for the first calls.
TEST_P(SharedBlocksTest, AFaultInAMoveOfEveryGroupChangesNothing) {
  CacheConfig c = window_first(16, 4);
  c.backend = kind();
  c.groups[kWindow].num_host_blocks = 8;
  c.groups[kFull].num_host_blocks = 8;
  const auto locations = [&](SequenceId id) {
    std::vector<BlockLocation> all;
    for (const int32_t g : {kWindow, kFull}) {
      const std::vector<BlockLocation> l = *cache_->block_locations(id, g);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  int64_t failed = 0;
  for (const auto& [fault, kernel_bytes] :
       {std::pair{FaultKind::kCopy, int64_t{0}}, std::pair{FaultKind::kLaunch, int64_t{1} << 20},
        std::pair{FaultKind::kEvent, int64_t{0}}, std::pair{FaultKind::kAllocation, int64_t{0}}}) {
    for (int64_t n = 1; n <= 4; ++n) {
      SCOPED_TRACE(std::string(fault_kind_name(fault)) + " n=" + std::to_string(n));
      cache_.reset();
      ref_.clear();
      backend_ = testing::make_backend(kind());
      ASSERT_NE(backend_, nullptr);
      auto faults = std::make_unique<FaultInjectionBackend>(*backend_);
      struct CacheFirst {  // the cache goes before the backend it runs on, also on a failure
        std::unique_ptr<ModelKvCache>& cache;
        ~CacheFirst() { cache.reset(); }
      } cache_first{cache_};
      ASSERT_NO_FATAL_FAILURE(make_sharing_on(c, faults.get(), kernel_bytes));
      ASSERT_OK(cache_->synchronize());
      for (const bool offload : {true, false}) {
        const std::vector<BlockLocation> before = locations(1);
        const SequenceResidency was = *cache_->residency(1);
        faults->fail_nth(fault, n);
        const Status st = offload ? cache_->offload(1) : cache_->restore(1);
        faults->disarm_all();
        if (!st.ok()) {
          ++failed;
          EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
          EXPECT_EQ(locations(1), before);
          EXPECT_EQ(*cache_->residency(1), was);
          invariants();
          ASSERT_OK(offload ? cache_->offload(1) : cache_->restore(1));
        }
        ASSERT_OK(cache_->synchronize());
        invariants();
      }
      EXPECT_EQ(*cache_->residency(1), SequenceResidency::kDevice);
      EXPECT_EQ(check_gather(1), "");
    }
  }
  EXPECT_GT(failed, 4);
}

// ---------------------------------------------------------------- ordering

// Offloads A, at once writes B into the window pages (and blocks) A's offload freed, through a
// batch (which, unlike write_kv, orders nothing itself), then restores A, which offloads B,
// and B, which offloads A: both read back exactly. The CPU backend's copies sleep 30 ms, so A's
// offload is still reading its pages when B's reservation takes them: the reservation must order
// B's writes into both groups' pools after that read.
TEST_P(SharedBlocksTest, WindowPagesAnOffloadStillReadsAreWrittenAfterIt) {
  if (kind() != BackendKind::kCpu) GTEST_SKIP() << "needs the CPU backend's copy delay";
  CacheConfig c = window_first(16, 4);
  c.backend = kind();
  c.groups[kWindow].num_host_blocks = 8;
  c.groups[kFull].num_host_blocks = 8;
  cache_.reset();
  ref_.clear();
  // Copies held at a gate while the test looks (GatedTransfers), and slow once released.
  CpuBackendOptions slow;
  slow.copy_delay = std::chrono::milliseconds(30);
  auto gated_backend = std::make_unique<testing::GatedTransfers>(create_cpu_backend(slow));
  testing::GatedTransfers& gated = *gated_backend;
  backend_ = std::move(gated_backend);
  // A: 40 tokens, by batched copies, which sleep (the kernel does not).
  ASSERT_NO_FATAL_FAILURE(make_sharing_on(c, backend_.get(), 0));
  std::vector<int32_t> a_pages;
  const std::vector<BlockLocation> a_blocks = *cache_->block_locations(1, kWindow);
  for (const BlockLocation& b : a_blocks) a_pages.push_back(b.block);
  gated.arm();
  ASSERT_OK(cache_->offload(1));
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kInFlight);  // the copy is held
  gated.release();  // and then sleeps while B writes (the test's uploads wait for compute)

  // B: 40 tokens in one batched step, into at least two of A's former pages.
  const std::vector<TokenId> b = iota_tokens(40, 2000);
  ASSERT_EQ(*cache_->add_sequence(2, b), 0);
  ref_[2] = {};
  ASSERT_OK(cache_->reserve_batch({2}, 40));
  int reused = 0;
  const std::vector<BlockLocation> b_blocks = *cache_->block_locations(2, kWindow);
  for (const BlockLocation& l : b_blocks) {
    reused += std::count(a_pages.begin(), a_pages.end(), l.block) > 0 ? 1 : 0;
  }
  EXPECT_GE(reused, 2);
  auto batch = cache_->build_batch({2});
  ASSERT_OK(batch);
  std::vector<std::unique_ptr<DeviceBuffer>> keep;  // read by queued writes until synchronize
  for (int32_t layer = 0; layer < 6; ++layer) {
    const CacheConfig& gc = gconf(lg(layer).group);
    const auto k = testing::model_rows(gc, layer, 0, b, 0);
    const auto v = testing::model_rows(gc, layer, 1, b, 0);
    keep.push_back(to_device(k.data(), k.size() * 2));
    keep.push_back(to_device(v.data(), v.size() * 2));
    ASSERT_OK(cache_->write_kv_batch(*batch, layer, keep[keep.size() - 2]->data(),
                                     keep.back()->data(), DType::kFloat16));
  }
  ASSERT_OK(cache_->commit_batch({2}, b, 40));
  ref_[2] = b;
  ASSERT_OK(cache_->synchronize());
  keep.clear();
  invariants();

  // The window group has pages for one of them: restoring A offloads B to make room there
  // (the full group has room for both), and the other way round.
  for (const auto& [in, out] : {std::pair<SequenceId, SequenceId>{1, 2}, {2, 1}}) {
    gated.arm();
    const Status st = cache_->restore(in);
    EXPECT_EQ(*cache_->residency(out), SequenceResidency::kInFlight);
    gated.release();
    ASSERT_OK(st);
    ASSERT_OK(cache_->synchronize());
    EXPECT_TRUE(cache_->drain_evicted_sequences().empty());
    EXPECT_EQ(*cache_->residency(out), SequenceResidency::kHost);
    invariants();
    EXPECT_EQ(check_gather(in), "") << "sequence " << in;
  }
  EXPECT_EQ(one().stats().sequences_offloaded, 3);
}

// Erasing a sequence keeps the window pages of prefix blocks another live sequence still holds:
// sequence 2 holds blocks 0..3 in its window; sequence 1 hits them, grows past them, and is
// erased. A third prompt with sequence 2's tokens then still hits all 64 of them (the window
// group's pages of blocks 0..3 are there), and sequence 2 still reads its bytes.
TEST_P(SharedBlocksTest, AnEraseKeepsTheWindowPagesAnotherSequenceHolds) {
  make(window_first(64, 32));
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<TokenId> shared = iota_tokens(64, 10);
  Status appended;
  ASSERT_EQ(*add_and_prefill(2, shared, &appended), 0);
  ASSERT_OK(appended);
  const std::vector<BlockLocation> window_of_2 = *cache_->block_locations(2, kWindow);
  ASSERT_EQ(window_of_2.size(), 4u);
  std::vector<TokenId> longer = shared;
  for (TokenId t : iota_tokens(64, 900)) longer.push_back(t);
  ASSERT_EQ(*add_and_prefill(1, longer, &appended), 64);
  ASSERT_OK(appended);
  invariants();
  ASSERT_OK(cache_->erase(1));
  ref_.erase(1);
  invariants();
  EXPECT_EQ(*cache_->block_locations(2, kWindow), window_of_2);
  EXPECT_EQ(check_gather(2), "");
  std::vector<TokenId> third = shared;
  third.push_back(77);
  ASSERT_EQ(*add_and_prefill(3, third, &appended), 64);
  ASSERT_OK(appended);
  invariants();
  EXPECT_EQ(check_gather(3), "");
}

// ---------------------------------------------------------------- events

// A router sees each group's blocks under that group's index: the full group's blocks as the
// one-group cache announces them, the window group's pages of the blocks in its window.
TEST_P(SharedBlocksTest, EventsNameTheirGroup) {
  make(window_first(64, 16));
  ASSERT_FALSE(HasFatalFailure());
  Status appended;
  ASSERT_EQ(*add_and_prefill(1, iota_tokens(160, 10), &appended), 0);  // 10 full blocks
  ASSERT_OK(appended);
  ASSERT_OK(cache_->finish(1));
  ref_.erase(1);
  invariants();
  std::map<int32_t, int64_t> stored, removed;
  for (const ControlEvent& e : cache_->drain_events()) {
    ASSERT_TRUE(e.group == kWindow || e.group == kFull) << e.group;
    if (e.kind == EventKind::kBlockStored) ++stored[e.group];
    if (e.kind == EventKind::kBlockRemoved) ++removed[e.group];
  }
  // The prefill's one reservation gave every block a window page, and the pages out of the
  // window stay cached while their blocks are indexed (a shorter prompt can hit them).
  EXPECT_EQ(stored[kFull], 10);
  EXPECT_EQ(stored[kWindow], 10);
  EXPECT_EQ(removed[kFull] + removed[kWindow], 0);
  // Another 160 tokens need 10 window pages of 16: four cached ones are evicted, in the window
  // group only (the full group has room).
  ASSERT_EQ(*add_and_prefill(2, iota_tokens(160, 5000), &appended), 0);
  ASSERT_OK(appended);
  invariants();
  stored.clear();
  for (const ControlEvent& e : cache_->drain_events()) {
    if (e.kind == EventKind::kBlockStored) ++stored[e.group];
    if (e.kind == EventKind::kBlockRemoved) ++removed[e.group];
  }
  EXPECT_EQ(stored[kFull], 10);
  EXPECT_EQ(stored[kWindow], 10);
  EXPECT_EQ(removed[kFull], 0);
  EXPECT_EQ(removed[kWindow], 4);
}

}  // namespace
}  // namespace pagedkv
