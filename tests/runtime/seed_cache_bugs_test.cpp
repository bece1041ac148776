// Regression tests for paged SeedKvCache bugs: rewrites of blocks shared through a prefix hit
// (copy-on-write), and writes to, restores of and rewrites of offloaded sequences whose
// written-but-not-advanced positions must follow the blocks to their new slots.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/seed_cache.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 2;
constexpr int32_t kDim = 4;
constexpr int64_t kRow = kHeads * kDim;

// Per (layer, K/V) the rows of each position, [heads * dim] each.
struct Rows {
  std::vector<std::vector<uint16_t>> at[kLayers][2];
  void set(int32_t layer, int64_t pos, const std::vector<uint16_t>& k,
           const std::vector<uint16_t>& v) {
    for (int part = 0; part < 2; ++part) {
      auto& r = at[layer][part];
      if (r.size() <= static_cast<size_t>(pos)) r.resize(static_cast<size_t>(pos) + 1);
      r[static_cast<size_t>(pos)] = part == 0 ? k : v;
    }
  }
};

class SeedCacheBugsTest : public ::testing::Test {
 protected:
  void make(int64_t device_blocks) {
    CacheConfig c;
    c.mode = CacheMode::kPaged;
    c.num_layers = kLayers;
    c.num_kv_heads = kHeads;
    c.head_dim = kDim;
    c.block_size = 4;
    c.num_device_blocks = device_blocks;
    c.num_host_blocks = 16;
    c.max_sequence_length = 32;
    c.backend = BackendKind::kCpu;
    cache_.reset();
    backend_ = create_cpu_backend({});
    SeedKvCacheOptions o;
    o.backend = backend_.get();
    auto made = SeedKvCache::create(c, o);
    ASSERT_OK(made);
    cache_ = std::move(made).value();
  }

  std::vector<uint16_t> random_halves(size_t n) {
    std::uniform_real_distribution<float> mag(0.125f, 4.0f);
    std::vector<uint16_t> out(n);
    for (auto& x : out) x = float_to_half_bits(rng_() % 2 ? mag(rng_) : -mag(rng_));
    return out;
  }

  // append_token on every layer at `pos` (not advanced), recorded in `ref`.
  void write(SequenceId id, Rows& ref, int64_t pos, std::optional<TokenId> token = {}) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      auto k = random_halves(kRow), v = random_halves(kRow);
      const Status st = cache_->append_token(id, layer, pos, k, v, token);
      ASSERT_OK(st);
      ref.set(layer, pos, k, v);
    }
  }

  // A packed [heads, len, dim] layer recorded in `ref` at positions [0, len).
  void record_packed(Rows& ref, int32_t layer, int64_t len, const std::vector<uint16_t>& k,
                     const std::vector<uint16_t>& v) {
    for (int64_t p = 0; p < len; ++p) {
      std::vector<uint16_t> kr(kRow), vr(kRow);
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t d = 0; d < kDim; ++d) {
          kr[static_cast<size_t>(h * kDim + d)] = k[static_cast<size_t>((h * len + p) * kDim + d)];
          vr[static_cast<size_t>(h * kDim + d)] = v[static_cast<size_t>((h * len + p) * kDim + d)];
        }
      ref.set(layer, p, kr, vr);
    }
  }

  // Every layer's keys and values of positions [0, len) read back equal `ref`.
  void expect_rows(SequenceId id, const Rows& ref, int64_t len) {
    ASSERT_EQ(*cache_->sequence_length(id), len);
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      auto onnx = cache_->get_layer_as_onnx(id, layer);
      ASSERT_OK(onnx);
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t p = 0; p < len; ++p)
          for (int64_t d = 0; d < kDim; ++d) {
            const size_t i = static_cast<size_t>((h * len + p) * kDim + d);
            const size_t r = static_cast<size_t>(h * kDim + d);
            ASSERT_EQ(onnx->key[i], ref.at[layer][0][static_cast<size_t>(p)][r])
                << "sequence " << id << " layer " << layer << " pos " << p;
            ASSERT_EQ(onnx->value[i], ref.at[layer][1][static_cast<size_t>(p)][r])
                << "sequence " << id << " layer " << layer << " pos " << p;
          }
    }
  }

  // Sequence 1 holds tokens {5, 6, 7, 8, 9} (one full cached block); sequence 2 is allocated
  // with the same prompt and shares that block.
  void share_a_prefix(Rows& ref) {
    ASSERT_OK(cache_->allocate_sequence(1, {}));
    for (int64_t p = 0; p < 5; ++p) write(1, ref, p, static_cast<TokenId>(5 + p));
    ASSERT_OK(cache_->advance_sequence_by(1, 5));
    ASSERT_EQ(*cache_->allocate_sequence(2, {5, 6, 7, 8, 9}), 4);
  }

  // Sequence 1 has 4 advanced positions and position 4 written, not advanced; then it is
  // offloaded.
  void offload_with_a_pending_write(Rows& ref) {
    ASSERT_OK(cache_->allocate_sequence(1, {}));
    for (int64_t p = 0; p < 5; ++p) write(1, ref, p);
    ASSERT_OK(cache_->advance_sequence_by(1, 4));
    ASSERT_OK(cache_->paged_cache()->offload(1));
  }

  void restore_if_offloaded(SequenceId id) {
    auto res = cache_->paged_cache()->residency(id);
    ASSERT_OK(res);
    if (*res == SequenceResidency::kHost) {
      ASSERT_OK(cache_->restore_offloaded_sequence(id));
    }
  }

  std::mt19937 rng_{99};
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<SeedKvCache> cache_;
};

TEST_F(SeedCacheBugsTest, SetPackedLayerOverASharedPrefixCopiesOnWrite) {
  make(32);
  Rows one;
  share_a_prefix(one);
  Rows two = one;
  auto k = random_halves(kHeads * 4 * kDim), v = random_halves(kHeads * 4 * kDim);
  ASSERT_OK(cache_->set_packed_layer(2, 0, 4, k, v));
  record_packed(two, 0, 4, k, v);
  expect_rows(2, two, 4);
  expect_rows(1, one, 5);
  // Later prompts with that prefix still read sequence 1's bytes.
  ASSERT_EQ(*cache_->allocate_sequence(3, {5, 6, 7, 8, 9}), 4);
  expect_rows(3, one, 4);
  // Sequence 2 goes on from its own copy.
  write(2, two, 4, 9);
  ASSERT_OK(cache_->advance_sequence(2));
  expect_rows(2, two, 5);
  expect_rows(1, one, 5);
}

TEST_F(SeedCacheBugsTest, RewritingASharedPrefixWithPendingWritesIsRefused) {
  make(32);
  Rows one;
  share_a_prefix(one);
  Rows two = one;
  write(2, two, 4, 9);  // pending: the copy would drop it
  auto k = random_halves(kHeads * 4 * kDim), v = random_halves(kHeads * 4 * kDim);
  EXPECT_EQ(cache_->set_packed_layer(2, 0, 4, k, v).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(cache_->advance_sequence(2));
  expect_rows(2, two, 5);
  expect_rows(1, one, 5);
}

TEST_F(SeedCacheBugsTest, RewriteAfterRollbackWithTheSameTokenIdsReadsTheCachedBlock) {
  // Documented (docs/seed-compatibility.md): commit finds the full block's tokens cached and
  // switches to that block, so the rewritten bytes of a whole block are dropped.
  make(32);
  Rows one;
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  for (int64_t p = 0; p < 8; ++p) write(1, one, p, static_cast<TokenId>(10 + p));
  ASSERT_OK(cache_->advance_sequence_by(1, 8));
  ASSERT_OK(cache_->rollback_sequence(1, 4));
  Rows rewritten = one;
  for (int64_t p = 4; p < 8; ++p) write(1, rewritten, p, static_cast<TokenId>(10 + p));
  ASSERT_OK(cache_->advance_sequence_by(1, 4));
  expect_rows(1, one, 8);
}

TEST_F(SeedCacheBugsTest, OverwriteLayerOverASharedPrefixCopiesOnWrite) {
  make(32);
  Rows one;
  share_a_prefix(one);
  Rows two = one;
  auto k = random_halves(kHeads * 4 * kDim), v = random_halves(kHeads * 4 * kDim);
  ASSERT_OK(cache_->overwrite_layer(2, 1, k, v, 4, 4));
  record_packed(two, 1, 4, k, v);
  expect_rows(2, two, 4);
  expect_rows(1, one, 5);
  ASSERT_EQ(*cache_->allocate_sequence(3, {5, 6, 7, 8, 9}), 4);
  expect_rows(3, one, 4);
}

TEST_F(SeedCacheBugsTest, RewritingAPendingPositionOfAnOffloadedSequenceLeavesOthersAlone) {
  make(6);
  Rows one, two;
  offload_with_a_pending_write(one);
  // Sequence 2 takes the device blocks sequence 1 held.
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  for (int64_t p = 0; p < 16; ++p) write(2, two, p);
  ASSERT_OK(cache_->advance_sequence_by(2, 16));
  write(1, one, 4);  // rewrites the pending position
  restore_if_offloaded(2);
  expect_rows(2, two, 16);
  restore_if_offloaded(1);
  ASSERT_OK(cache_->advance_sequence(1));
  expect_rows(1, one, 5);
}

TEST_F(SeedCacheBugsTest, AppendingToAnOffloadedSequenceKeepsItsPendingWrites) {
  make(6);
  Rows one, two;
  offload_with_a_pending_write(one);
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  for (int64_t p = 0; p < 8; ++p) write(2, two, p);
  ASSERT_OK(cache_->advance_sequence_by(2, 8));
  write(1, one, 5);  // a new position: the reservation grows and the sequence comes back
  ASSERT_OK(cache_->advance_sequence_by(1, 2));
  expect_rows(1, one, 6);
  restore_if_offloaded(2);
  expect_rows(2, two, 8);
}

TEST_F(SeedCacheBugsTest, RestoreKeepsPendingWrites) {
  make(32);
  Rows one;
  offload_with_a_pending_write(one);
  ASSERT_OK(cache_->restore_offloaded_sequence(1));
  ASSERT_OK(cache_->advance_sequence(1));
  expect_rows(1, one, 5);
}

TEST_F(SeedCacheBugsTest, AllocateOfAnOffloadedSequenceKeepsPendingWrites) {
  make(32);
  Rows one;
  offload_with_a_pending_write(one);
  ASSERT_EQ(*cache_->allocate_sequence(1, {1, 2, 3, 4, 5, 6}), 4);
  ASSERT_OK(cache_->advance_sequence(1));
  expect_rows(1, one, 5);
}

TEST_F(SeedCacheBugsTest, SetPackedLayerOnAnOffloadedSequenceWrites) {
  make(32);
  Rows one;
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  for (int64_t p = 0; p < 6; ++p) write(1, one, p);
  ASSERT_OK(cache_->advance_sequence_by(1, 6));
  ASSERT_OK(cache_->paged_cache()->offload(1));
  auto k = random_halves(kHeads * 6 * kDim), v = random_halves(kHeads * 6 * kDim);
  ASSERT_OK(cache_->set_packed_layer(1, 0, 6, k, v));
  record_packed(one, 0, 6, k, v);
  restore_if_offloaded(1);
  expect_rows(1, one, 6);
  auto k2 = random_halves(kHeads * 6 * kDim), v2 = random_halves(kHeads * 6 * kDim);
  ASSERT_OK(cache_->paged_cache()->offload(1));
  ASSERT_OK(cache_->overwrite_layer(1, 1, k2, v2, 6, 6));
  record_packed(one, 1, 6, k2, v2);
  restore_if_offloaded(1);
  expect_rows(1, one, 6);
}

TEST_F(SeedCacheBugsTest, HeadRangeRewriteOnAnOffloadedSequenceWrites) {
  make(32);
  Rows one;
  offload_with_a_pending_write(one);
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    for (int32_t h = 0; h < kHeads; ++h) {
      auto k = random_halves(kDim), v = random_halves(kDim);
      ASSERT_OK(cache_->append_head_range_seq_first(1, layer, h, 4, k, v));
      for (int64_t d = 0; d < kDim; ++d) {
        one.at[layer][0][4][static_cast<size_t>(h * kDim + d)] = k[static_cast<size_t>(d)];
        one.at[layer][1][4][static_cast<size_t>(h * kDim + d)] = v[static_cast<size_t>(d)];
      }
    }
  }
  restore_if_offloaded(1);
  ASSERT_OK(cache_->advance_sequence(1));
  expect_rows(1, one, 5);
}

// The seed kept the active set as a list of ids, allocated or not; a port that marks the next
// request active before allocating it must not get kNotFound (which kept the old set, so the
// paused sequence stayed protected and the running one could be offloaded).
TEST_F(SeedCacheBugsTest, SetActiveSequencesAcceptsIdsNotYetAllocated) {
  make(6);
  Rows one, two, four, three;
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  ASSERT_OK(cache_->set_active_sequences({1, 2}));  // 2 comes next
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  for (int64_t p = 0; p < 8; ++p) write(2, two, p);
  ASSERT_OK(cache_->advance_sequence_by(2, 8));
  ASSERT_OK(cache_->allocate_sequence(4, {}));  // inactive, and used after 2
  for (int64_t p = 0; p < 8; ++p) write(4, four, p);
  ASSERT_OK(cache_->advance_sequence_by(4, 8));
  // Sequence 3 needs a block more than is free: the planner must take the inactive 4, not the
  // least recently used 2.
  ASSERT_OK(cache_->allocate_sequence(3, {}));
  for (int64_t p = 0; p < 12; ++p) write(3, three, p);
  ASSERT_OK(cache_->advance_sequence_by(3, 12));
  EXPECT_EQ(*cache_->paged_cache()->residency(2), SequenceResidency::kDevice);
  EXPECT_NE(*cache_->paged_cache()->residency(4), SequenceResidency::kDevice);
  expect_rows(2, two, 8);
  expect_rows(3, three, 12);
  // The set stays as given: an id removed and allocated again is active again.
  ASSERT_OK(cache_->remove_sequence(2));
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  ASSERT_OK(cache_->paged_cache()->check_invariants());
}

}  // namespace
}  // namespace pagedkv
