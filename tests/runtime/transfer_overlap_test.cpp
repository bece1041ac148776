// Transfers that overlap compute, on the CPU backend with slow copies (each copy on the transfer
// engine's streams sleeps 150 ms) and, as its CUDA twin, on a GPU with a sequence large enough
// that its copies take milliseconds: a prefetch or a restore does not make the compute stream wait
// when it is submitted, so work queued on the compute stream right after it (an event, here)
// completes while the copies still run; the first call that uses the moved blocks (build_batch,
// gather_layer, write_kv, a copy-on-write) waits for them, and reads exactly the bytes the
// sequence had before it was offloaded. Each case runs on a one-group cache and on a cache
// whose layers alternate full attention and a sliding window (two groups sharing their logical
// blocks), where every group is ordered per block too; and a reservation in that cache does not
// wait for an offload still reading other window pages.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "runtime/device_kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::make_model_rows;
using testing::model_rows_difference;

// The cache's shape. On the CPU backend every copy of the transfer engine sleeps 150 ms; on a
// GPU a sequence of about 64 MiB (96 MiB with the window group) takes about 1-2 ms over PCIe, ample
// for an event on an idle compute stream to complete before the copies do.
struct Shape {
  int32_t heads, head_dim, window_heads, block_size;
  int64_t tokens, blocks;
};
Shape shape_for(BackendKind kind) {
  return kind == BackendKind::kCuda ? Shape{8, 128, 4, 16, 8190, 640} : Shape{2, 8, 1, 4, 10, 16};
}

// One group, or two: layers 0 and 2 full attention, 1 and 3 a sliding window longer than the
// sequence (so every position stays readable) with their own shape.
CacheConfig overlap_config(BackendKind kind, bool hybrid) {
  const Shape s = shape_for(kind);
  CacheConfig c;
  c.block_size = s.block_size;
  c.backend = kind;
  if (!hybrid) {
    c.num_layers = 2;
    c.num_kv_heads = s.heads;
    c.head_dim = s.head_dim;
    c.num_device_blocks = s.blocks;
    c.num_host_blocks = s.blocks;
    return c;
  }
  c.num_layers = 4;
  KvGroup full;
  full.name = "full";
  full.layers = {0, 2};
  full.num_kv_heads = s.heads;
  full.head_dim = s.head_dim;
  full.num_device_blocks = s.blocks;
  full.num_host_blocks = s.blocks;
  KvGroup window = full;
  window.name = "window";
  window.layers = {1, 3};
  window.num_kv_heads = s.window_heads;
  window.sliding_window = static_cast<int32_t>(s.tokens + 4 * s.block_size);
  c.groups = {full, window};
  return c;
}

class TransferOverlapTest : public ::testing::TestWithParam<std::tuple<bool, BackendKind>> {
 protected:
  bool hybrid() const { return std::get<0>(GetParam()); }
  BackendKind kind() const { return std::get<1>(GetParam()); }

  void SetUp() override {
    testing::require_backend(kind());
    if (IsSkipped() || HasFatalFailure()) return;
    CpuBackendOptions slow;
    slow.copy_delay = std::chrono::milliseconds(150);
    backend_ = testing::make_backend(kind(), slow);
    ASSERT_NE(backend_, nullptr);
    config_ = overlap_config(kind(), hybrid());
    KvCacheOptions o;
    o.backend = backend_.get();
    o.transfer_kernel_block_bytes = 0;  // batched copies: one delayed copy per direction
    auto cache = KvCache::create(config_, o);
    ASSERT_OK(cache);
    cache_ = std::move(cache).value();
    for (int64_t i = 0; i < shape_for(kind()).tokens; ++i) {
      tokens_.push_back(static_cast<TokenId>(300 + 7 * i));
    }
    ASSERT_OK(cache_->add_sequence(1, tokens_));
    ASSERT_OK(cache_->reserve(1, static_cast<int64_t>(tokens_.size())));
    write_model(1, tokens_, 0);
    ASSERT_OK(cache_->commit(1, tokens_));
    ASSERT_OK(cache_->offload(1));
    ASSERT_OK(cache_->synchronize());
    ASSERT_EQ(*cache_->residency(1), SequenceResidency::kHost);
  }

  void TearDown() override { cache_.reset(); }  // before the backend it runs on

  // The shape of `layer`'s group.
  CacheConfig layer_config(int32_t layer) const {
    return config_.group_config(config_.layer_groups()[static_cast<size_t>(layer)].group);
  }
  size_t row(int32_t layer) const {
    const CacheConfig c = layer_config(layer);
    return static_cast<size_t>(c.num_kv_heads * c.head_dim);
  }

  // Writes the model's K/V of `tokens` at positions start.. of `id` into every layer.
  void write_model(SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      DeviceBuffer k(*backend_, tokens.size() * row(layer) * 2),
          v(*backend_, tokens.size() * row(layer) * 2);
      const Stream s = cache_->compute_stream();
      ASSERT_OK(
          make_model_rows(*backend_, s, k.data(), layer_config(layer), layer, 0, tokens, start));
      ASSERT_OK(
          make_model_rows(*backend_, s, v.data(), layer_config(layer), layer, 1, tokens, start));
      ASSERT_OK(cache_->write_kv(id, layer, k.data(), v.data(), DType::kFloat16));
      ASSERT_OK(cache_->synchronize());
    }
  }

  // Records an event on the compute stream and waits for it; returns whether sequence 1's
  // transfer was still running once it had completed.
  bool compute_ran_ahead_of_the_copies() {
    auto event = backend_->create_event();
    EXPECT_OK(event);
    EXPECT_OK(backend_->record_event(*event, cache_->compute_stream()));
    EXPECT_OK(backend_->synchronize_event(*event));
    const bool in_flight = *cache_->residency(1) == SequenceResidency::kInFlight;
    backend_->destroy_event(*event);
    return in_flight;
  }

  void expect_model_bytes() {
    const int64_t n = static_cast<int64_t>(tokens_.size());
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      DeviceBuffer k(*backend_, tokens_.size() * row(layer) * 2),
          v(*backend_, tokens_.size() * row(layer) * 2);
      ASSERT_OK(cache_->gather_layer(1, layer, k.data(), v.data(), DType::kFloat16,
                                     PackedLayout::kTokenMajor, 0, n));
      const Stream s = cache_->compute_stream();
      EXPECT_EQ(
          model_rows_difference(*backend_, s, k.data(), layer_config(layer), layer, 0, tokens_, 0),
          "");
      EXPECT_EQ(
          model_rows_difference(*backend_, s, v.data(), layer_config(layer), layer, 1, tokens_, 0),
          "");
    }
  }

  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> cache_;
  std::vector<TokenId> tokens_;
};

TEST_P(TransferOverlapTest, APrefetchLetsComputeRunAheadAndItsFirstReadWaitsForTheCopies) {
  ASSERT_OK(cache_->prefetch({1}));
  EXPECT_TRUE(compute_ran_ahead_of_the_copies())
      << "the compute stream waited for the prefetch when it was submitted";
  expect_model_bytes();  // gather_layer waits for the copies on the compute stream
  ASSERT_OK(cache_->check_invariants());
}

TEST_P(TransferOverlapTest, ARestoreLetsComputeRunAheadAndABatchOfItWaitsForTheCopies) {
  ASSERT_OK(cache_->restore(1));
  EXPECT_TRUE(compute_ran_ahead_of_the_copies());
  // A batch of the sequence (each group's): its readers on the compute stream come after the
  // copies.
  auto batch = cache_->build_batches({1});
  ASSERT_OK(batch);
  auto event = backend_->create_event();
  ASSERT_OK(event);
  ASSERT_OK(backend_->record_event(*event, cache_->compute_stream()));
  ASSERT_OK(backend_->synchronize_event(*event));
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kDevice)
      << "work queued after build_batch ran before the restore's copies";
  backend_->destroy_event(*event);
  expect_model_bytes();
}

TEST_P(TransferOverlapTest, AWriteIntoAPrefetchedBlockComesAfterTheCopies) {
  // The next position lands in the sequence's last, partly filled block, which the prefetch brings
  // back: the write must not be overwritten by the copy still under way.
  ASSERT_OK(cache_->prefetch({1}));
  const std::vector<TokenId> next = {999};
  ASSERT_OK(cache_->reserve(1, 1));
  const int64_t end = static_cast<int64_t>(tokens_.size());
  write_model(1, next, end);
  ASSERT_OK(cache_->commit(1, next));
  tokens_.push_back(999);
  expect_model_bytes();
  ASSERT_OK(cache_->check_invariants());
}

// Review finding N2-4: a reservation in a cache with a window group waited for every offload
// still reading any page of that group. Sequence 2 reserves a token inside its last block (no
// new block, no new page) while sequence 1's offload still reads its blocks and pages: the
// compute stream does not wait for that offload.
TEST_P(TransferOverlapTest, AReservationDoesNotWaitForAnOffloadReadingOtherBlocks) {
  ASSERT_OK(cache_->restore(1));
  ASSERT_OK(cache_->synchronize());
  const std::vector<TokenId> second = {11, 12, 13, 14, 15};  // two blocks, the second has room
  ASSERT_EQ(*cache_->add_sequence(2, second), 0);
  ASSERT_OK(cache_->reserve(2, 5));
  write_model(2, second, 0);
  ASSERT_OK(cache_->commit(2, second));
  ASSERT_OK(cache_->offload(1));
  ASSERT_EQ(*cache_->residency(1), SequenceResidency::kInFlight);
  ASSERT_OK(cache_->reserve(2, 1));
  EXPECT_TRUE(compute_ran_ahead_of_the_copies())
      << "the reservation made the compute stream wait for the offload";
  write_model(2, {16}, 5);
  ASSERT_OK(cache_->commit(2, {16}));
  ASSERT_OK(cache_->synchronize());
  ASSERT_OK(cache_->restore(1));
  expect_model_bytes();  // the offload read sequence 1's bytes, not sequence 2's
  ASSERT_OK(cache_->check_invariants());
}

INSTANTIATE_TEST_SUITE_P(Groups, TransferOverlapTest,
                         ::testing::Combine(::testing::Bool(), testing::runtime_backends()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, BackendKind>>& info) {
                           return std::string(std::get<0>(info.param) ? "FullAndWindow"
                                                                      : "OneGroup") +
                                  "_" + testing::backend_label(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace pagedkv
