// Call sequences that tests/fuzz/kv_cache_fuzz.cpp found breaking KvCache (or the ops under it),
// kept as plain tests. Each input that found one is also in tests/fuzz/corpus/kv_cache/.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/ops.hpp"
#include "runtime/kv_model.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::model_rows;

class KvCacheFuzzRegression : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.num_layers = 1;
    config_.num_kv_heads = 1;
    config_.head_dim = 8;
    config_.block_size = 2;
    config_.num_device_blocks = 4;
    config_.num_host_blocks = 4;
    config_.backend = BackendKind::kCpu;
    backend_ = create_cpu_backend();
    KvCacheOptions o;
    o.backend = backend_.get();
    cache_ = std::move(KvCache::create(config_, o)).value();
  }

  void append(SequenceId id, const std::vector<TokenId>& tokens) {
    const int64_t start = *cache_->length(id);
    ASSERT_OK(cache_->reserve(id, static_cast<int64_t>(tokens.size())));
    const std::vector<uint16_t> k = model_rows(config_, 0, 0, tokens, start);
    const std::vector<uint16_t> v = model_rows(config_, 0, 1, tokens, start);
    DeviceBuffer dk(*backend_, k.size() * 2), dv(*backend_, v.size() * 2);
    dk.upload(k);
    dv.upload(v);
    ASSERT_OK(cache_->write_kv(id, 0, dk.data(), dv.data(), DType::kFloat16));
    ASSERT_OK(cache_->synchronize());
    ASSERT_OK(cache_->commit(id, tokens));
  }

  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> cache_;
};

// Fuzz input crash-gather-position-overflow: gather_layer(position_begin = 2,
// num_tokens = INT64_MAX) added the two (signed overflow, UBSan) before rejecting them.
TEST_F(KvCacheFuzzRegression, GatherLayerRejectsRangesWhoseEndOverflows) {
  ASSERT_OK(cache_->add_sequence(1, {}));
  append(1, {3, 4, 5});
  DeviceBuffer k(*backend_, 1024), v(*backend_, 1024);
  for (const auto& [begin, num] : std::vector<std::pair<int64_t, int64_t>>{
           {2, INT64_MAX}, {INT64_MAX, 1}, {INT64_MIN, -1}, {INT64_MIN, 1}, {4, -1}, {1, 3}}) {
    const Status s = cache_->gather_layer(1, 0, k.data(), v.data(), DType::kFloat16,
                                          PackedLayout::kTokenMajor, begin, num);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << begin << " " << num << ": " << s.to_string();
  }
  EXPECT_OK(cache_->gather_layer(1, 0, k.data(), v.data(), DType::kFloat16,
                                 PackedLayout::kTokenMajor, 1, 2));
  ASSERT_OK(cache_->synchronize());  // the gather writes k and v asynchronously
  EXPECT_OK(cache_->check_invariants());
}

// The same overflow one layer down, in the ops' own range check (gather_layer and
// scatter_layer format the error message).
TEST_F(KvCacheFuzzRegression, GatherOpRejectsRangesWhoseEndOverflows) {
  DeviceBuffer table(*backend_, sizeof(int32_t) * 2), k(*backend_, 1024), v(*backend_, 1024);
  PackedLayerArgs a;
  a.key = k.data();
  a.value = v.data();
  a.packed_dtype = DType::kFloat16;
  a.block_table = static_cast<const int32_t*>(table.data());
  a.block_table_len = 2;
  a.position_begin = 2;
  a.num_tokens = INT64_MAX;
  const Status s = gather_layer(*backend_, cache_->device_pool(), a, cache_->compute_stream());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
}

// A reservation whose sequence another reserve offloaded (the planner moved its blocks to the
// host and handed the device blocks to someone else): write_kv must not write through the stale
// slots into the other sequence's blocks, and after a restore it writes to the new ones.
TEST_F(KvCacheFuzzRegression, WriteAfterPlannerOffloadNeverTouchesOtherSequences) {
  ASSERT_OK(cache_->add_sequence(1, {}));
  append(1, {1, 2});
  ASSERT_OK(cache_->reserve(1, 2));  // sequence 1: 2 blocks, the second reserved
  ASSERT_OK(cache_->add_sequence(2, {}));
  ASSERT_OK(cache_->set_active({2}));
  append(2, {5, 6, 7, 8, 9, 4});  // 3 blocks of 4: sequence 1 is offloaded to make room
  ASSERT_EQ(*cache_->residency(1) == SequenceResidency::kDevice, false);
  const std::vector<uint16_t> junk(static_cast<size_t>(2 * config_.head_dim), 0x3c00);
  DeviceBuffer dj(*backend_, junk.size() * 2);
  dj.upload(junk);
  EXPECT_EQ(cache_->write_kv(1, 0, dj.data(), dj.data(), DType::kFloat16).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_OK(cache_->synchronize());
  // Sequence 2 still reads back as written.
  DeviceBuffer k(*backend_, 6 * 8 * 2), v(*backend_, 6 * 8 * 2);
  ASSERT_OK(
      cache_->gather_layer(2, 0, k.data(), v.data(), DType::kFloat16, PackedLayout::kTokenMajor));
  EXPECT_EQ(k.download<uint16_t>(), model_rows(config_, 0, 0, {5, 6, 7, 8, 9, 4}, 0));
  EXPECT_EQ(v.download<uint16_t>(), model_rows(config_, 0, 1, {5, 6, 7, 8, 9, 4}, 0));
  // Once restored, the reservation is writable again, at its new slots.
  ASSERT_OK(cache_->erase(2));
  ASSERT_OK(cache_->restore(1));
  const std::vector<TokenId> more{3, 3};
  const std::vector<uint16_t> mk = model_rows(config_, 0, 0, more, 2);
  const std::vector<uint16_t> mv = model_rows(config_, 0, 1, more, 2);
  DeviceBuffer dk(*backend_, mk.size() * 2), dv(*backend_, mv.size() * 2);
  dk.upload(mk);
  dv.upload(mv);
  ASSERT_OK(cache_->write_kv(1, 0, dk.data(), dv.data(), DType::kFloat16));
  ASSERT_OK(cache_->commit(1, more));
  DeviceBuffer k1(*backend_, 4 * 8 * 2), v1(*backend_, 4 * 8 * 2);
  ASSERT_OK(
      cache_->gather_layer(1, 0, k1.data(), v1.data(), DType::kFloat16, PackedLayout::kTokenMajor));
  EXPECT_EQ(k1.download<uint16_t>(), model_rows(config_, 0, 0, {1, 2, 3, 3}, 0));
  EXPECT_EQ(v1.download<uint16_t>(), model_rows(config_, 0, 1, {1, 2, 3, 3}, 0));
  EXPECT_OK(cache_->check_invariants());
}

}  // namespace
}  // namespace pagedkv
