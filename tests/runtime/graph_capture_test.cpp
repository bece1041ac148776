// CUDA-graph capture on the CPU: the fault-injecting backend simulates a capture (is_capturing()
// is true, and any allocation, event record or query, synchronization, host function or upload
// it sees counts as a violation). A decode step runs three times with its K/V writes "captured":
// reserve_batch and build_vllm_batch_into (caller-owned, fixed buffers) before the capture,
// write_kv_batch of every layer inside it, commit_batch after it. The capturable calls make no
// forbidden call, every other call refuses with kFailedPrecondition before touching the backend
// and changes nothing, and the pool holds exactly the model's bytes afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/batch_formats.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "runtime/kv_model.hpp"
#include "support/backend_test.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

constexpr int32_t kMaxReqs = 4;
constexpr int32_t kMaxBlocks = 8;
constexpr int64_t kNumSlots = 6;  // fixed across steps: a captured write reads this many slots

class GraphCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    inner_ = create_cpu_backend({});
    faults_ = std::make_unique<FaultInjectionBackend>(*inner_);
    config_.num_layers = 2;
    config_.num_kv_heads = 2;
    config_.head_dim = 8;
    config_.block_size = 4;
    config_.num_device_blocks = 32;
    config_.num_host_blocks = 8;
    config_.backend = BackendKind::kCpu;
    KvCacheOptions o;
    o.backend = faults_.get();
    auto cache = KvCache::create(config_, o);
    ASSERT_OK(cache);
    cache_ = std::move(cache).value();
    row_ = static_cast<size_t>(config_.num_kv_heads * config_.head_dim);
    block_table_ = std::make_unique<DeviceBuffer>(*inner_, kMaxReqs * kMaxBlocks * 4);
    slot_mapping_ = std::make_unique<DeviceBuffer>(*inner_, kNumSlots * 8);
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      k_in_.push_back(std::make_unique<DeviceBuffer>(*inner_, kNumSlots * row_ * 2));
      v_in_.push_back(std::make_unique<DeviceBuffer>(*inner_, kNumSlots * row_ * 2));
    }
    // Three sequences with computed prompts of 5, 9 and 3 tokens.
    for (SequenceId id : ids_) {
      std::vector<TokenId> prompt;
      for (int i = 0; i < static_cast<int>(id) * 4 - 3; ++i) prompt.push_back(100 * id + i);
      ASSERT_OK(cache_->add_sequence(id, prompt));
      ASSERT_OK(cache_->reserve(id, static_cast<int64_t>(prompt.size())));
      for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
        DeviceBuffer k(*inner_, prompt.size() * row_ * 2), v(*inner_, prompt.size() * row_ * 2);
        k.upload(model_rows(config_, layer, 0, prompt, 0));
        v.upload(model_rows(config_, layer, 1, prompt, 0));
        ASSERT_OK(cache_->write_kv(id, layer, k.data(), v.data(), DType::kFloat16));
        ASSERT_OK(cache_->synchronize());
      }
      ASSERT_OK(cache_->commit(id, prompt));
      tokens_[id] = prompt;
    }
  }

  VllmBuffers buffers() {
    VllmBuffers b;
    b.block_table = static_cast<int32_t*>(block_table_->data());
    b.max_reqs = kMaxReqs;
    b.max_blocks = kMaxBlocks;
    b.slot_mapping = static_cast<int64_t*>(slot_mapping_->data());
    b.num_slots = kNumSlots;
    return b;
  }

  // The model's K/V of this step's new tokens (one per sequence, rows in ids_ order, padding
  // rows zero) into the fixed input buffers, as the model's forward would produce them there.
  void stage_inputs(const std::vector<TokenId>& next) {
    std::vector<int64_t> positions;
    for (SequenceId id : ids_) positions.push_back(static_cast<int64_t>(tokens_[id].size()));
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      k_in_[static_cast<size_t>(layer)]->upload(
          testing::step_rows(config_, layer, 0, next, positions, kNumSlots));
      v_in_[static_cast<size_t>(layer)]->upload(
          testing::step_rows(config_, layer, 1, next, positions, kNumSlots));
    }
  }

  // Every call a capture must not record: each refuses while capturing, without a backend call,
  // and changes nothing.
  void expect_every_other_call_refused(const DeviceBatch& fixed) {
    DeviceBuffer scratch(*inner_, 64 * row_ * 2);
    const std::vector<std::pair<const char*, std::function<Status()>>> calls = {
        {"add_sequence",
         [&] {
           return cache_->add_sequence(9, {1, 2, 3}).status();
         }},
        {"reserve", [&] { return cache_->reserve(1, 1).status(); }},
        {"reserve_batch", [&] { return cache_->reserve_batch(ids_, 1).status(); }},
        {"write_kv",
         [&] {
           return cache_->write_kv(1, 0, k_in_[0]->data(), v_in_[0]->data(), DType::kFloat16);
         }},
        {"commit", [&] { return cache_->commit(1, {7}); }},
        {"commit_batch",
         [&] {
           return cache_->commit_batch(ids_, {7, 7, 7}, 1);
         }},
        {"rollback", [&] { return cache_->rollback(1, 2); }},
        {"fork", [&] { return cache_->fork(1, 10); }},
        {"finish", [&] { return cache_->finish(2); }},
        {"erase", [&] { return cache_->erase(2); }},
        {"offload", [&] { return cache_->offload(3); }},
        {"restore", [&] { return cache_->restore(3); }},
        {"prefetch", [&] { return cache_->prefetch({3}); }},
        {"residency", [&] { return cache_->residency(1).status(); }},
        {"build_batch", [&] { return cache_->build_batch(ids_).status(); }},
        {"build_vllm_batch_into",
         [&] { return build_vllm_batch_into(*cache_, ids_, buffers()).status(); }},
        {"gather_layer",
         [&] {
           return cache_->gather_layer(1, 0, scratch.data(), nullptr, DType::kFloat16,
                                       PackedLayout::kTokenMajor, 0, 1);
         }},
        {"synchronize", [&] { return cache_->synchronize(); }},
        {"fetch_from_storage",
         [&] {
           return cache_->fetch_from_storage({1, 2, 3, 4, 5}).status();
         }},
        {"poll_storage", [&] { return cache_->poll_storage(); }},
        {"flush_storage", [&] { return cache_->flush_storage(); }},
    };
    const testing::NamedStats before = testing::named_stats(cache_->stats());
    for (const auto& [name, call] : calls) {
      const Status st = call();
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << name << ": " << st.to_string();
      EXPECT_NE(st.message().find("capturing a CUDA graph"), std::string::npos) << name;
      EXPECT_NE(st.message().find("build_vllm_batch_into"), std::string::npos)
          << name << ": the message names the capturable alternative";
      EXPECT_EQ(faults_->capture_violations(), 0) << name << " reached the backend";
      EXPECT_EQ(testing::stats_diff(before, testing::named_stats(cache_->stats())), "") << name;
    }
    EXPECT_TRUE(fixed.caller_owned_slots);
  }

  void expect_model_bytes() {
    for (SequenceId id : ids_) {
      const std::vector<TokenId>& t = tokens_[id];
      const int64_t n = static_cast<int64_t>(t.size());
      for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
        DeviceBuffer k(*inner_, t.size() * row_ * 2), v(*inner_, t.size() * row_ * 2);
        ASSERT_OK(cache_->gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                       PackedLayout::kTokenMajor, 0, n));
        ASSERT_OK(cache_->synchronize());
        ASSERT_EQ(k.download<uint16_t>(), model_rows(config_, layer, 0, t, 0))
            << "seq " << id << " layer " << layer;
        ASSERT_EQ(v.download<uint16_t>(), model_rows(config_, layer, 1, t, 0))
            << "seq " << id << " layer " << layer;
      }
    }
  }

  CacheConfig config_;
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<FaultInjectionBackend> faults_;
  std::unique_ptr<KvCache> cache_;
  size_t row_ = 0;
  std::unique_ptr<DeviceBuffer> block_table_, slot_mapping_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_in_, v_in_;
  const std::vector<SequenceId> ids_ = {1, 2, 3};
  std::map<SequenceId, std::vector<TokenId>> tokens_;
};

TEST_F(GraphCaptureTest, ADecodeStepCapturesItsWritesAndEveryOtherCallRefuses) {
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenId> next = {TokenId(900 + step), TokenId(910 + step),
                                       TokenId(920 + step)};
    ASSERT_OK(cache_->reserve_batch(ids_, 1));
    auto batch = build_vllm_batch_into(*cache_, ids_, buffers());
    ASSERT_OK(batch);
    ASSERT_TRUE(batch->caller_owned_slots);
    ASSERT_EQ(batch->slot_mapping, slot_mapping_->data()) << "the batch reads the fixed buffer";
    stage_inputs(next);
    ASSERT_OK(cache_->synchronize());  // the builds' uploads ran before the "capture" begins

    faults_->simulate_capture(true);
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      ASSERT_OK(cache_->write_kv_batch(*batch, layer, k_in_[static_cast<size_t>(layer)]->data(),
                                       v_in_[static_cast<size_t>(layer)]->data(), DType::kFloat16));
    }
    EXPECT_EQ(faults_->capture_violations(), 0) << "write_kv_batch made a call a capture forbids";
    if (step == 0) expect_every_other_call_refused(*batch);
    faults_->simulate_capture(false);

    ASSERT_OK(cache_->commit_batch(ids_, next, 1));
    for (size_t r = 0; r < ids_.size(); ++r) tokens_[ids_[r]].push_back(next[r]);
    ASSERT_OK(cache_->check_invariants());
  }
  expect_model_bytes();
}

TEST_F(GraphCaptureTest, AWriteThroughABatchInTheUploadArenaIsRefusedInACapture) {
  ASSERT_OK(cache_->reserve_batch(ids_, 1));
  auto batch = cache_->build_batch(ids_);
  ASSERT_OK(batch);
  EXPECT_FALSE(batch->caller_owned_slots);
  faults_->simulate_capture(true);
  for (bool all_layers : {false, true}) {
    const Status st = all_layers ? cache_->write_kv_batch_all_layers(
                                       *batch, k_in_[0]->data(), v_in_[0]->data(), DType::kFloat16)
                                 : cache_->write_kv_batch(*batch, 0, k_in_[0]->data(),
                                                          v_in_[0]->data(), DType::kFloat16);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
    EXPECT_NE(st.message().find("caller-owned"), std::string::npos) << st.to_string();
  }
  EXPECT_EQ(faults_->capture_violations(), 0);
  faults_->simulate_capture(false);
  // Outside a capture the same write is fine.
  ASSERT_OK(cache_->write_kv_batch(*batch, 0, k_in_[0]->data(), v_in_[0]->data(), DType::kFloat16));
}

TEST_F(GraphCaptureTest, BuildBatchIntoGivenASlotMappingBufferGivesACapturableBatch) {
  ASSERT_OK(cache_->reserve_batch(ids_, 1));
  DeviceBuffer indptr(*inner_, (kMaxReqs + 1) * 4), indices(*inner_, 64 * 4),
      last(*inner_, kMaxReqs * 4);
  CsrBuffers csr;
  csr.kv_indptr = static_cast<int32_t*>(indptr.data());
  csr.kv_indices = static_cast<int32_t*>(indices.data());
  csr.kv_last_page_len = static_cast<int32_t*>(last.data());
  csr.max_batch = kMaxReqs;
  csr.max_pages = 64;
  auto arena = build_batch_into(*cache_, ids_, csr, nullptr);
  ASSERT_OK(arena);
  EXPECT_FALSE(arena->caller_owned_slots) << "without a slot-mapping buffer";
  csr.slot_mapping = static_cast<int64_t*>(slot_mapping_->data());
  csr.num_slots = 2;
  EXPECT_EQ(build_batch_into(*cache_, ids_, csr, nullptr).status().code(),
            StatusCode::kInvalidArgument)
      << "three tokens do not fit two slots";
  csr.num_slots = kNumSlots;
  auto fixed = build_batch_into(*cache_, ids_, csr, nullptr);
  ASSERT_OK(fixed);
  EXPECT_TRUE(fixed->caller_owned_slots);
  EXPECT_EQ(fixed->slot_mapping, slot_mapping_->data());
  ASSERT_OK(cache_->synchronize());
  const std::vector<int64_t> slots = slot_mapping_->download<int64_t>();
  ASSERT_EQ(slots.size(), static_cast<size_t>(kNumSlots));
  for (size_t r = 0; r < ids_.size(); ++r) {
    EXPECT_EQ(slots[r], *cache_->slot(ids_[r], *cache_->length(ids_[r]))) << "row " << r;
  }
  for (size_t r = ids_.size(); r < slots.size(); ++r) EXPECT_EQ(slots[r], -1) << "padding";
}

}  // namespace
}  // namespace pagedkv
