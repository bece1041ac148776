// The CUDA twin of graph_capture_test.cpp: a real CUDA-graph capture (tests/support/cuda_graph.hpp)
// instead of the fault-injecting backend's simulation. One cache captures a decode step's K/V
// writes (write_kv_batch of every layer over a batch built into a caller-owned slot-mapping
// buffer, from fixed K/V input buffers) once, on its own compute stream, and replays the graph
// over three steps; between replays, outside any capture, it reserves, rebuilds the batch into
// the same buffer and uploads the step's K/V into the same inputs. A second cache runs the same
// steps without a graph. Both pools then hold the same bytes, the model's. While the capture is
// open, the calls a capture must not record refuse with kFailedPrecondition; had one reached the
// device (an allocation, an event query, a synchronization), the global-mode capture would be
// invalidated and end_capture would fail. CUDA only: without a device (or CUDA) the test skips,
// and fails under PAGEDKV_REQUIRE_CUDA=1.
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
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/cuda_graph.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::model_rows;

constexpr int32_t kMaxReqs = 4;
constexpr int64_t kMaxPages = 64;
constexpr int64_t kNumSlots = 6;  // fixed across steps: the captured writes read this many slots

// One cache on its own compute stream (a created, non-blocking stream: the legacy default
// stream cannot be captured) with its step's fixed device buffers.
struct Twin {
  Stream stream{};
  void* native = nullptr;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<DeviceBuffer> indptr, indices, last_page_len, slot_mapping;
  std::vector<std::unique_ptr<DeviceBuffer>> k_in, v_in;  // per layer, kNumSlots rows

  CsrBuffers csr() const {
    CsrBuffers b;
    b.kv_indptr = static_cast<int32_t*>(indptr->data());
    b.kv_indices = static_cast<int32_t*>(indices->data());
    b.kv_last_page_len = static_cast<int32_t*>(last_page_len->data());
    b.max_batch = kMaxReqs;
    b.max_pages = kMaxPages;
    b.slot_mapping = static_cast<int64_t*>(slot_mapping->data());
    b.num_slots = kNumSlots;
    return b;
  }
};

class GraphCaptureCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::require_backend(BackendKind::kCuda);
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_TRUE(testing::kCudaGraphBuilt) << "a CUDA device, but the graph support is the stub";
    backend_ = testing::make_backend(BackendKind::kCuda);
    ASSERT_NE(backend_, nullptr);
    config_.num_layers = 2;
    config_.num_kv_heads = 2;
    config_.head_dim = 8;
    config_.block_size = 4;
    config_.num_device_blocks = 32;
    config_.num_host_blocks = 8;
    config_.backend = BackendKind::kCuda;
    row_ = static_cast<size_t>(config_.num_kv_heads * config_.head_dim);
    // Three sequences with computed prompts of 5, 9 and 3 tokens.
    for (SequenceId id : ids_) {
      std::vector<TokenId> prompt;
      for (int i = 0; i < static_cast<int>(id) * 4 - 3; ++i) prompt.push_back(100 * id + i);
      tokens_[id] = prompt;
    }
    for (Twin* t : {&captured_, &plain_}) ASSERT_NO_FATAL_FAILURE(make_twin(*t));
    // Allocated (and freed) outside the capture: a cudaMalloc inside would invalidate it.
    scratch_ = std::make_unique<DeviceBuffer>(*backend_, 64 * row_ * 2);
  }

  void TearDown() override {
    testing::destroy(graph_);
    scratch_.reset();
    for (Twin* t : {&captured_, &plain_}) {
      t->cache.reset();
      if (backend_ && t->native != nullptr) backend_->destroy_stream(t->stream);
    }
  }

  void make_twin(Twin& t) {
    auto stream = backend_->create_stream();
    ASSERT_OK(stream);
    t.stream = *stream;
    auto native = backend_->native_stream(t.stream);
    ASSERT_OK(native);
    ASSERT_NE(*native, nullptr);
    t.native = *native;
    KvCacheOptions o;
    o.backend = backend_.get();
    o.compute_stream = t.stream;
    auto cache = KvCache::create(config_, o);
    ASSERT_OK(cache);
    t.cache = std::move(cache).value();
    t.indptr = std::make_unique<DeviceBuffer>(*backend_, (kMaxReqs + 1) * 4);
    t.indices = std::make_unique<DeviceBuffer>(*backend_, kMaxPages * 4);
    t.last_page_len = std::make_unique<DeviceBuffer>(*backend_, kMaxReqs * 4);
    t.slot_mapping = std::make_unique<DeviceBuffer>(*backend_, kNumSlots * 8);
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      t.k_in.push_back(std::make_unique<DeviceBuffer>(*backend_, kNumSlots * row_ * 2));
      t.v_in.push_back(std::make_unique<DeviceBuffer>(*backend_, kNumSlots * row_ * 2));
    }
    for (SequenceId id : ids_) {
      const std::vector<TokenId>& prompt = tokens_[id];
      ASSERT_OK(t.cache->add_sequence(id, prompt));
      ASSERT_OK(t.cache->reserve(id, static_cast<int64_t>(prompt.size())));
      for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
        DeviceBuffer k(*backend_, prompt.size() * row_ * 2), v(*backend_, prompt.size() * row_ * 2);
        k.upload(model_rows(config_, layer, 0, prompt, 0));
        v.upload(model_rows(config_, layer, 1, prompt, 0));
        ASSERT_OK(t.cache->write_kv(id, layer, k.data(), v.data(), DType::kFloat16));
        ASSERT_OK(t.cache->synchronize());
      }
      ASSERT_OK(t.cache->commit(id, prompt));
    }
  }

  // Reserves one slot per sequence and builds the batch into the twin's fixed buffers, then
  // uploads the model's K/V of `next` (rows in ids_ order, padding rows zero) into its fixed
  // inputs, as a model's forward would leave them there.
  DeviceBatch prepare_step(Twin& t, const std::vector<TokenId>& next) {
    EXPECT_OK(t.cache->reserve_batch(ids_, 1));
    auto batch = build_batch_into(*t.cache, ids_, t.csr(), nullptr);
    EXPECT_OK(batch);
    if (!batch.ok()) return {};
    EXPECT_TRUE(batch->caller_owned_slots);
    EXPECT_EQ(batch->slot_mapping, t.slot_mapping->data()) << "the batch reads the fixed buffer";
    std::vector<int64_t> positions;
    for (SequenceId id : ids_) positions.push_back(static_cast<int64_t>(tokens_[id].size()));
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      t.k_in[static_cast<size_t>(layer)]->upload(
          testing::step_rows(config_, layer, 0, next, positions, kNumSlots));
      t.v_in[static_cast<size_t>(layer)]->upload(
          testing::step_rows(config_, layer, 1, next, positions, kNumSlots));
    }
    return *batch;
  }

  Status write_every_layer(Twin& t, const DeviceBatch& batch) {
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const auto l = static_cast<size_t>(layer);
      PAGEDKV_RETURN_IF_ERROR(t.cache->write_kv_batch(batch, layer, t.k_in[l]->data(),
                                                      t.v_in[l]->data(), DType::kFloat16));
    }
    return ok_status();
  }

  // Inside the open capture: each call that would allocate, upload, query, synchronize or
  // record work a replay must not repeat refuses, and the capture stays open.
  void expect_refused_in_capture(Twin& t) {
    const std::vector<std::pair<const char*, std::function<Status()>>> calls = {
        {"reserve", [&] { return t.cache->reserve(1, 1).status(); }},
        {"reserve_batch", [&] { return t.cache->reserve_batch(ids_, 1).status(); }},
        {"build_batch", [&] { return t.cache->build_batch(ids_).status(); }},
        {"build_batch_into",
         [&] { return build_batch_into(*t.cache, ids_, t.csr(), nullptr).status(); }},
        {"commit_batch",
         [&] {
           return t.cache->commit_batch(ids_, {7, 7, 7}, 1);
         }},
        {"gather_layer",
         [&] {
           return t.cache->gather_layer(1, 0, scratch_->data(), nullptr, DType::kFloat16,
                                        PackedLayout::kTokenMajor, 0, 1);
         }},
        {"offload", [&] { return t.cache->offload(3); }},
        {"prefetch", [&] { return t.cache->prefetch({3}); }},
        {"synchronize", [&] { return t.cache->synchronize(); }},
    };
    for (const auto& [name, call] : calls) {
      const Status st = call();
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << name << ": " << st.to_string();
      EXPECT_NE(st.message().find("capturing a CUDA graph"), std::string::npos) << name;
      auto capturing = backend_->is_capturing(t.stream);
      ASSERT_OK(capturing);
      EXPECT_TRUE(*capturing) << "the capture ended (was invalidated) after " << name;
    }
  }

  void expect_same_bytes_and_the_model() {
    for (SequenceId id : ids_) {
      const std::vector<TokenId>& t = tokens_[id];
      const int64_t n = static_cast<int64_t>(t.size());
      for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
        std::vector<uint16_t> got[2][2];  // [twin][K, V]
        int which = 0;
        for (Twin* twin : {&captured_, &plain_}) {
          DeviceBuffer k(*backend_, t.size() * row_ * 2), v(*backend_, t.size() * row_ * 2);
          ASSERT_OK(twin->cache->gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                              PackedLayout::kTokenMajor, 0, n));
          ASSERT_OK(twin->cache->synchronize());
          got[which][0] = k.download<uint16_t>();
          got[which][1] = v.download<uint16_t>();
          ++which;
        }
        for (int32_t part = 0; part < 2; ++part) {
          EXPECT_EQ(got[0][part], got[1][part])
              << "replayed vs uncaptured: seq " << id << " layer " << layer << " part " << part;
          EXPECT_EQ(got[0][part], model_rows(config_, layer, part, t, 0))
              << "replayed vs model: seq " << id << " layer " << layer << " part " << part;
        }
      }
    }
  }

  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  size_t row_ = 0;
  Twin captured_, plain_;
  std::unique_ptr<DeviceBuffer> scratch_;  // gather_layer's output in the refusal check
  testing::GraphExec graph_;
  const std::vector<SequenceId> ids_ = {1, 2, 3};
  std::map<SequenceId, std::vector<TokenId>> tokens_;
};

TEST_F(GraphCaptureCudaTest, ACapturedStepReplayedOverThreeStepsWritesWhatAnUncapturedRunWrites) {
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenId> next = {TokenId(900 + step), TokenId(910 + step),
                                       TokenId(920 + step)};
    // The captured twin: the step's batch and inputs outside the capture, then the graph.
    const DeviceBatch batch = prepare_step(captured_, next);
    ASSERT_FALSE(HasFailure());
    ASSERT_OK(captured_.cache->synchronize());  // nothing of the build is left to capture
    if (step == 0) {
      ASSERT_OK(testing::begin_capture(captured_.native));
      const Status written = write_every_layer(captured_, batch);
      if (written.ok()) expect_refused_in_capture(captured_);
      auto graph = testing::end_capture(captured_.native);  // always end what was begun
      ASSERT_OK(written);
      ASSERT_OK(graph);
      graph_ = *graph;
    }
    ASSERT_OK(testing::replay(graph_, captured_.native));
    ASSERT_OK(captured_.cache->synchronize());  // the next step's uploads overwrite the inputs
    ASSERT_OK(captured_.cache->commit_batch(ids_, next, 1));
    ASSERT_OK(captured_.cache->check_invariants());

    // The uncaptured twin, the same step.
    const DeviceBatch plain_batch = prepare_step(plain_, next);
    ASSERT_FALSE(HasFailure());
    ASSERT_OK(write_every_layer(plain_, plain_batch));
    ASSERT_OK(plain_.cache->synchronize());
    ASSERT_OK(plain_.cache->commit_batch(ids_, next, 1));

    for (size_t r = 0; r < ids_.size(); ++r) tokens_[ids_[r]].push_back(next[r]);
  }
  expect_same_bytes_and_the_model();
}

}  // namespace
}  // namespace pagedkv
