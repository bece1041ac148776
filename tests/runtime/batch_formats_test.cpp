// The kernel argument formats of batch_formats.hpp on random batches, checked against formulas
// written here over the slots that reserve() handed out (not over the cache's batch metadata):
// CSR into fixed-address buffers (FlashInfer CUDA-graph mode), append indices (FlashInfer's
// get_batch_indices_positions) and vLLM's block_table / -1-padded slot_mapping.
#include "pagedkv/batch_formats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kPoison = 0x7f7f7f7f;

CacheConfig small_config() {
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.block_size = kBlockSize;
  c.num_device_blocks = 512;
  c.backend = BackendKind::kCpu;
  return c;
}

// What the test knows of a sequence from the calls it made: the physical block of each logical
// block (from the slots reserve() returned) and its committed and reserved token counts.
struct Expected {
  std::vector<int32_t> table;
  int64_t length = 0;
  std::vector<int64_t> pending_slots;
};

class BatchFormatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto kv = KvCache::create(small_config());
    ASSERT_OK(kv);
    kv_ = std::move(*kv);
  }

  void note_slots(Expected& e, int64_t first_position, const std::vector<int64_t>& slots) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t pos = first_position + static_cast<int64_t>(i);
      const size_t logical = static_cast<size_t>(pos / kBlockSize);
      if (e.table.size() <= logical) e.table.resize(logical + 1, -1);
      e.table[logical] = static_cast<int32_t>(slots[i] / kBlockSize);
    }
  }

  // `n` sequences with random prompts (some sharing a prefix, some forked), committed, then a
  // random number of reserved (pending) tokens each, 0 included.
  std::vector<SequenceId> random_batch(std::mt19937& rng, int n) {
    std::vector<SequenceId> ids;
    std::uniform_int_distribution<int> len(1, 23), pend(0, 6), coin(0, 3);
    std::vector<TokenId> shared(8);
    for (auto& t : shared) t = static_cast<TokenId>(rng() % 1000);
    for (int i = 0; i < n; ++i) {
      const SequenceId id = next_id_++;
      if (i > 0 && coin(rng) == 0) {  // a fork shares every block of its parent
        const SequenceId parent = ids[static_cast<size_t>(rng() % ids.size())];
        EXPECT_OK(kv_->fork(parent, id));
        expected_[id] = expected_[parent];
        expected_[id].pending_slots.clear();
      } else {
        std::vector<TokenId> prompt = coin(rng) == 0 ? shared : std::vector<TokenId>{};
        if (prompt.empty()) prompt.push_back(static_cast<TokenId>(1000 + rng() % 1000));
        const int extra = len(rng);
        for (int t = 0; t < extra; ++t) prompt.push_back(static_cast<TokenId>(rng() % 1000));
        auto cached = kv_->add_sequence(id, prompt);
        EXPECT_OK(cached);
        Expected& e = expected_[id];
        // A prefix hit: the cached blocks are the ones the first sharer was given.
        if (*cached > 0) e.table = expected_[first_sharer_].table;
        e.table.resize(static_cast<size_t>(*cached / kBlockSize));
        const std::vector<TokenId> todo(prompt.begin() + *cached, prompt.end());
        auto slots = kv_->reserve(id, static_cast<int64_t>(todo.size()));
        EXPECT_OK(slots);
        note_slots(e, *cached, *slots);
        EXPECT_OK(kv_->commit(id, todo));
        e.length = static_cast<int64_t>(prompt.size());
        // The first sharer that missed registered the prefix blocks that later ones hit.
        if (*cached == 0 && prompt.size() > shared.size() &&
            std::equal(shared.begin(), shared.end(), prompt.begin())) {
          first_sharer_ = id;
        }
      }
      ids.push_back(id);
    }
    for (SequenceId id : ids) {
      Expected& e = expected_[id];
      auto slots = kv_->reserve(id, pend(rng));
      EXPECT_OK(slots);
      note_slots(e, e.length, *slots);  // copy-on-write moves the last block: noted here
      e.pending_slots = *slots;
    }
    return ids;
  }

  int64_t seq_len(SequenceId id) {
    return expected_[id].length + static_cast<int64_t>(expected_[id].pending_slots.size());
  }

  std::unique_ptr<KvCache> kv_;
  std::map<SequenceId, Expected> expected_;
  SequenceId next_id_ = 1;
  SequenceId first_sharer_ = 0;
};

TEST_F(BatchFormatsTest, CsrIntoFixedBuffersMatchesTheFormulasOnRandomBatches) {
  std::mt19937 rng(7);
  // Fixed addresses across steps, as a captured CUDA graph needs (CPU backend: host memory).
  std::vector<int32_t> indptr(65), indices(4096), last(64);
  for (int step = 0; step < 20; ++step) {
    const std::vector<SequenceId> ids = random_batch(rng, 1 + static_cast<int>(rng() % 12));
    for (auto* v : {&indptr, &indices, &last}) std::fill(v->begin(), v->end(), kPoison);
    const CsrBuffers buffers{indptr.data(), indices.data(), last.data(), 64, 4096};
    CsrHostCopy host;
    auto batch = build_batch_into(*kv_, ids, buffers, &host);
    ASSERT_OK(batch);
    ASSERT_OK(kv_->synchronize());

    int32_t offset = 0;
    ASSERT_EQ(indptr[0], 0);
    ASSERT_EQ(host.kv_indptr.size(), ids.size() + 1);
    for (size_t r = 0; r < ids.size(); ++r) {
      const int64_t len = seq_len(ids[r]);
      const int32_t pages = static_cast<int32_t>((len + kBlockSize - 1) / kBlockSize);
      const std::vector<int32_t>& table = expected_[ids[r]].table;
      for (int32_t p = 0; p < pages; ++p) {
        EXPECT_EQ(indices[static_cast<size_t>(offset + p)], table[static_cast<size_t>(p)])
            << "row " << r << " page " << p;
      }
      offset += pages;
      EXPECT_EQ(indptr[r + 1], offset) << "row " << r;
      EXPECT_EQ(host.kv_indptr[r + 1], offset) << "row " << r;
      const int32_t want_last = static_cast<int32_t>(len - int64_t{pages - 1} * kBlockSize);
      EXPECT_GE(want_last, 1);
      EXPECT_LE(want_last, kBlockSize);
      EXPECT_EQ(last[r], want_last) << "row " << r;
      EXPECT_EQ(host.kv_last_page_len[r], want_last) << "row " << r;
    }
    EXPECT_EQ(indptr[ids.size() + 1], kPoison) << "an entry past the batch was written";
    EXPECT_EQ(indices[static_cast<size_t>(offset)], kPoison);
    for (SequenceId id : ids) ASSERT_OK(kv_->erase(id));
    ASSERT_OK(kv_->check_invariants());
  }
}

TEST_F(BatchFormatsTest, AppendIndicesFollowGetBatchIndicesPositions) {
  std::mt19937 rng(11);
  std::vector<int32_t> dev_batch(512), dev_pos(512);
  for (int step = 0; step < 20; ++step) {
    const std::vector<SequenceId> ids = random_batch(rng, 1 + static_cast<int>(rng() % 12));
    auto batch = kv_->build_batch(ids);
    ASSERT_OK(batch);
    auto coo = append_indices(*kv_, ids, *batch);
    ASSERT_OK(coo);
    std::fill(dev_batch.begin(), dev_batch.end(), kPoison);
    std::fill(dev_pos.begin(), dev_pos.end(), kPoison);
    auto shared = std::make_shared<const AppendIndices>(*coo);
    ASSERT_OK(upload_append_indices(*kv_, shared, dev_batch.data(), dev_pos.data(), 512));
    shared.reset();  // the cache keeps the host arrays alive until the copy ran
    ASSERT_OK(kv_->synchronize());

    size_t k = 0;
    ASSERT_EQ(coo->append_indptr[0], 0);
    for (size_t r = 0; r < ids.size(); ++r) {
      const int32_t a = static_cast<int32_t>(expected_[ids[r]].pending_slots.size());
      const int64_t len = seq_len(ids[r]);
      ASSERT_EQ(coo->append_indptr[r + 1] - coo->append_indptr[r], a) << "row " << r;
      for (int32_t j = 0; j < a; ++j, ++k) {
        EXPECT_EQ(coo->batch_indices[k], static_cast<int32_t>(r));
        EXPECT_EQ(coo->positions[k], len - a + j);
        EXPECT_EQ(dev_batch[k], static_cast<int32_t>(r));
        EXPECT_EQ(dev_pos[k], len - a + j);
      }
    }
    EXPECT_EQ(coo->batch_indices.size(), k);
    EXPECT_EQ(dev_batch[k], kPoison);
    for (SequenceId id : ids) ASSERT_OK(kv_->erase(id));
  }
}

TEST_F(BatchFormatsTest, VllmBlockTableAndPaddedSlotMappingMatchTheFormulas) {
  std::mt19937 rng(13);
  constexpr int32_t kMaxReqs = 16, kMaxBlocks = 12;
  constexpr int64_t kSlots = 96;
  std::vector<int32_t> table(size_t{kMaxReqs} * kMaxBlocks);
  std::vector<int64_t> slots(kSlots);
  for (int step = 0; step < 20; ++step) {
    const std::vector<SequenceId> ids = random_batch(rng, 1 + static_cast<int>(rng() % 12));
    std::fill(table.begin(), table.end(), kPoison);
    std::fill(slots.begin(), slots.end(), int64_t{kPoison});
    const VllmBuffers buffers{table.data(), kMaxReqs, kMaxBlocks, slots.data(), kSlots};
    auto batch = build_vllm_batch_into(*kv_, ids, buffers);
    ASSERT_OK(batch);
    ASSERT_OK(kv_->synchronize());

    size_t k = 0;
    for (size_t r = 0; r < ids.size(); ++r) {
      const Expected& e = expected_[ids[r]];
      const int64_t pages = (seq_len(ids[r]) + kBlockSize - 1) / kBlockSize;
      for (int64_t c = 0; c < kMaxBlocks; ++c) {
        const int32_t want = c < pages ? e.table[static_cast<size_t>(c)] : -1;
        EXPECT_EQ(table[r * kMaxBlocks + static_cast<size_t>(c)], want) << "row " << r;
      }
      for (int64_t s : e.pending_slots) EXPECT_EQ(slots[k++], s) << "row " << r;
    }
    for (; k < static_cast<size_t>(kSlots); ++k) EXPECT_EQ(slots[k], -1) << "padding " << k;
    EXPECT_EQ(table[ids.size() * kMaxBlocks], kPoison) << "a row past the batch was written";
    for (SequenceId id : ids) ASSERT_OK(kv_->erase(id));
  }
}

TEST_F(BatchFormatsTest, TooSmallBuffersAreRefusedAndTheCacheIsUnchanged) {
  std::mt19937 rng(17);
  const std::vector<SequenceId> ids = random_batch(rng, 6);
  // How far one build_batch moves the generation, to tell later whether a refused call built.
  auto first = kv_->build_batch(ids);
  auto before = kv_->build_batch(ids);
  ASSERT_OK(first);
  ASSERT_OK(before);
  const uint64_t generation = before->generation;
  const uint64_t step = before->generation - first->generation;
  const ControlStats stats = kv_->stats();
  std::vector<int32_t> a(64), b(1), c(64);
  std::vector<int64_t> s(1);

  auto csr = build_batch_into(*kv_, ids, CsrBuffers{a.data(), b.data(), c.data(), 64, 1}, nullptr);
  EXPECT_EQ(csr.status().code(), StatusCode::kInvalidArgument);
  csr = build_batch_into(*kv_, ids, CsrBuffers{a.data(), c.data(), c.data(), 2, 64}, nullptr);
  EXPECT_EQ(csr.status().code(), StatusCode::kInvalidArgument);
  csr = build_batch_into(*kv_, ids, CsrBuffers{nullptr, c.data(), c.data(), 64, 64}, nullptr);
  EXPECT_EQ(csr.status().code(), StatusCode::kInvalidArgument);
  csr = build_batch_into(*kv_, {999}, CsrBuffers{a.data(), c.data(), c.data(), 64, 64}, nullptr);
  EXPECT_EQ(csr.status().code(), StatusCode::kNotFound);
  auto vllm = build_vllm_batch_into(*kv_, ids, VllmBuffers{a.data(), 64, 1, s.data(), 1});
  EXPECT_EQ(vllm.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(upload_append_indices(*kv_, nullptr, a.data(), c.data(), 64).code(),
            StatusCode::kInvalidArgument);

  // Unchanged: the last batch is still current (a refused call built none) and stats agree.
  auto again = kv_->build_batch(ids);
  ASSERT_OK(again);
  EXPECT_EQ(again->generation, generation + step);
  EXPECT_EQ(kv_->stats().device.used_blocks, stats.device.used_blocks);
  EXPECT_EQ(kv_->stats().device.free_blocks, stats.device.free_blocks);
  EXPECT_OK(kv_->check_invariants());
  // A batch that no longer describes the rows is refused.
  ASSERT_OK(kv_->reserve(ids[0], 1));
  EXPECT_EQ(append_indices(*kv_, ids, *again).status().code(), StatusCode::kInvalidArgument);
}

// The vLLM and append-index uploads go through the cache's pinned upload arena: a decode loop of
// build_vllm_batch_into and upload_append_indices queues no host function and, with a step shape
// that covers the buffers, allocates nothing after the first step. The device arrays match a
// reference built here from the cache's own queries (block_locations, reserved_slots).
TEST(BatchFormatsStepTest, VllmAndAppendStepsQueueNoHostFunctionAndAllocateNothing) {
  constexpr int32_t kBatch = 24, kMaxBlocks = 16, kSteps = 12;
  constexpr int64_t kSlots = kBatch;
  std::unique_ptr<Backend> inner = create_cpu_backend({});
  FaultInjectionBackend faults(*inner);
  CacheConfig c = small_config();
  c.num_device_blocks = kBatch * kMaxBlocks;
  KvCacheOptions o;
  o.backend = &faults;
  o.step_shape = StepShape{kBatch, kMaxBlocks, kSlots};
  auto created = KvCache::create(c, o);
  ASSERT_OK(created);
  KvCache& kv = **created;
  std::vector<SequenceId> ids;
  for (SequenceId id = 1; id <= kBatch; ++id) {
    std::vector<TokenId> prompt(static_cast<size_t>(3 + id % 9));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(id * 100 + i);
    ASSERT_OK(kv.add_sequence(id, prompt));
    ASSERT_OK(kv.reserve(id, static_cast<int64_t>(prompt.size())));
    ASSERT_OK(kv.commit(id, prompt));
    ids.push_back(id);
  }
  // Caller-owned buffers at fixed addresses (CPU backend: host memory is device memory).
  std::vector<int32_t> table(size_t{kBatch} * kMaxBlocks);
  std::vector<int64_t> slots(kSlots);
  std::vector<int32_t> dev_batch(kSlots), dev_pos(kSlots);
  const VllmBuffers buffers{table.data(), kBatch, kMaxBlocks, slots.data(), kSlots};
  const std::vector<TokenId> next(kBatch, 7);
  faults.record_launches(true);
  for (int32_t step = 0; step < kSteps; ++step) {
    if (step == 1) faults.reset_counts();  // the first step may size what it needs
    ASSERT_OK(kv.reserve_batch(ids, 1));
    auto batch = build_vllm_batch_into(kv, ids, buffers);
    ASSERT_OK(batch);
    auto coo = append_indices(kv, ids, *batch);
    ASSERT_OK(coo);
    auto host = std::make_shared<AppendIndices>(*coo);
    ASSERT_OK(upload_append_indices(kv, host, dev_batch.data(), dev_pos.data(), kSlots));
    // Copied out when the call returned: changing the host arrays now changes nothing queued.
    std::fill(host->batch_indices.begin(), host->batch_indices.end(), kPoison);
    std::fill(host->positions.begin(), host->positions.end(), kPoison);
    ASSERT_OK(kv.synchronize());
    // The naive reference, from the cache's queries.
    for (size_t r = 0; r < ids.size(); ++r) {
      auto blocks = kv.block_locations(ids[r]);
      auto reserved = kv.reserved_slots(ids[r], 0);
      auto length = kv.length(ids[r]);
      ASSERT_OK(blocks);
      ASSERT_OK(reserved);
      ASSERT_OK(length);
      for (size_t col = 0; col < static_cast<size_t>(kMaxBlocks); ++col) {
        const int32_t want = col < blocks->size() ? (*blocks)[col].block : -1;
        ASSERT_EQ(table[r * kMaxBlocks + col], want) << "step " << step << " row " << r;
      }
      ASSERT_EQ(reserved->size(), 1u);
      ASSERT_EQ(slots[r], (*reserved)[0]) << "step " << step << " row " << r;
      ASSERT_EQ(dev_batch[r], static_cast<int32_t>(r)) << "step " << step;
      ASSERT_EQ(dev_pos[r], *length) << "step " << step;  // the one appended token's position
    }
    ASSERT_OK(kv.commit_batch(ids, next, 1));
  }
  for (const LaunchCall& l : faults.launch_calls()) {
    EXPECT_FALSE(l.host_func) << "a host function per step (a pageable upload kept alive)";
  }
  EXPECT_EQ(faults.count(FaultKind::kAllocation), 0) << "the steps after the first allocated";
  EXPECT_OK(kv.check_invariants());
}

}  // namespace
}  // namespace pagedkv
