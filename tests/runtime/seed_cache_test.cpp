// SeedKvCache: each seed method's documented behaviour in dense and paged mode, on real fp16
// bytes compared with a host model of the sequence, plus regression tests for seed defects 3
// (overwrite_layer loses other layers), 4 (ONNX export without values), 8 (panics, padding,
// truncation) and 10 (packed view rebuilt with a fresh allocation on every miss). Each test runs
// in both modes on both backends (runtime_backends.hpp).
#include "pagedkv/seed_cache.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "pagedkv/cpu_backend.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 3;
constexpr int32_t kDim = 8;
constexpr int64_t kRow = kHeads * kDim;

CacheConfig seed_config(CacheMode mode) {
  CacheConfig c;
  c.mode = mode;
  c.num_layers = kLayers;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = 4;
  c.num_device_blocks = 32;
  c.num_host_blocks = 16;
  c.max_sequence_length = 64;
  c.dense_initial_length = 4;
  c.dense_max_free_buffers = 1;
  c.backend = BackendKind::kCpu;
  return c;
}

// The host model of one sequence: per (layer, part) a [pos][heads * dim] table.
struct RefSeq {
  std::vector<std::vector<uint16_t>> rows[kLayers][2];
  int64_t length = 0;
};

class SeedCacheTest : public ::testing::TestWithParam<std::tuple<CacheMode, BackendKind>> {
 protected:
  void SetUp() override {
    testing::require_backend(backend_kind());
    if (IsSkipped() || HasFatalFailure()) return;
    make(seed_config(mode()));
  }

  CacheMode mode() const { return std::get<0>(GetParam()); }
  BackendKind backend_kind() const { return std::get<1>(GetParam()); }

  // `options` shape the CPU backend only (testing::make_backend).
  void make(CacheConfig config, const CpuBackendOptions& options = {}) {
    cache_.reset();
    config.backend = backend_kind();
    backend_ = testing::make_backend(backend_kind(), options);
    ASSERT_NE(backend_, nullptr);
    SeedKvCacheOptions o;
    o.backend = backend_.get();
    auto c = SeedKvCache::create(config, o);
    ASSERT_OK(c);
    cache_ = std::move(c).value();
  }

  bool paged() const { return mode() == CacheMode::kPaged; }

  // Random non-zero fp16 values of either sign.
  std::vector<uint16_t> random_halves(size_t n) {
    std::uniform_real_distribution<float> mag(0.125f, 4.0f);
    std::vector<uint16_t> out(n);
    for (auto& x : out) x = float_to_half_bits(rng_() % 2 ? mag(rng_) : -mag(rng_));
    return out;
  }

  // append_token for every layer at `pos`, recorded in `ref`.
  void append(SequenceId id, RefSeq& ref, int64_t pos, std::optional<TokenId> token = {}) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      auto k = random_halves(kRow), v = random_halves(kRow);
      Status st = cache_->append_token(id, layer, pos, k, v, token);
      ASSERT_OK(st);
      for (int part = 0; part < 2; ++part) {
        auto& rows = ref.rows[layer][part];
        if (rows.size() <= static_cast<size_t>(pos)) rows.resize(static_cast<size_t>(pos) + 1);
        rows[static_cast<size_t>(pos)] = part == 0 ? k : v;
      }
    }
  }

  void append_advance(SequenceId id, RefSeq& ref, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      append(id, ref, ref.length);
      ASSERT_OK(cache_->advance_sequence(id));
      ++ref.length;
    }
  }

  uint16_t expected(const RefSeq& ref, int32_t layer, int part, int64_t h, int64_t p,
                    int64_t d) const {
    return ref.rows[layer][part][static_cast<size_t>(p)][static_cast<size_t>(h * kDim + d)];
  }

  // Checks the ONNX export (keys and values) of every layer against the model.
  void expect_onnx(SequenceId id, const RefSeq& ref) {
    ASSERT_EQ(*cache_->sequence_length(id), ref.length);
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      auto onnx = cache_->get_layer_as_onnx(id, layer);
      ASSERT_OK(onnx);
      ASSERT_EQ(onnx->shape[0], 1);
      ASSERT_EQ(onnx->shape[1], kHeads);
      ASSERT_EQ(onnx->shape[2], ref.length);
      ASSERT_EQ(onnx->shape[3], kDim);
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t p = 0; p < ref.length; ++p)
          for (int64_t d = 0; d < kDim; ++d) {
            const size_t i = static_cast<size_t>((h * ref.length + p) * kDim + d);
            ASSERT_EQ(onnx->key[i], expected(ref, layer, 0, h, p, d))
                << "layer " << layer << " head " << h << " pos " << p;
            ASSERT_EQ(onnx->value[i], expected(ref, layer, 1, h, p, d))
                << "layer " << layer << " head " << h << " pos " << p;
          }
    }
  }

  // Downloads a [heads, len, dim] view with its head stride.
  std::vector<uint16_t> download(const void* base, int64_t len, int64_t head_stride) {
    EXPECT_OK(cache_->synchronize());
    std::vector<uint16_t> out(static_cast<size_t>(kHeads * len * kDim));
    for (int64_t h = 0; h < kHeads; ++h) {
      EXPECT_OK(backend_->copy_async(
          out.data() + h * len * kDim, static_cast<const uint16_t*>(base) + h * head_stride,
          static_cast<size_t>(len * kDim) * 2, CopyKind::kDeviceToHost, Stream{}));
    }
    EXPECT_OK(backend_->synchronize_stream(Stream{}));
    return out;
  }

  void expect_view(const SeedKvView& view, const RefSeq& ref, int32_t layer) {
    ASSERT_EQ(view.length, ref.length);
    auto k = download(view.key, view.length, view.head_stride);
    auto v = download(view.value, view.length, view.head_stride);
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t p = 0; p < ref.length; ++p)
        for (int64_t d = 0; d < kDim; ++d) {
          const size_t i = static_cast<size_t>((h * ref.length + p) * kDim + d);
          ASSERT_EQ(k[i], expected(ref, layer, 0, h, p, d));
          ASSERT_EQ(v[i], expected(ref, layer, 1, h, p, d));
        }
  }

  std::mt19937 rng_{1234};
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<SeedKvCache> cache_;
};

TEST_P(SeedCacheTest, AppendTokenThenAdvanceKeepsEveryLayerKeysAndValues) {
  ASSERT_EQ(*cache_->allocate_sequence(1, {5, 6, 7}), 0);
  EXPECT_TRUE(cache_->has_sequence(1));
  EXPECT_EQ(*cache_->sequence_length(1), 0);
  RefSeq ref;
  append_advance(1, ref, 11);  // crosses blocks (4) and dense growth (4 -> 8 -> 16)
  expect_onnx(1, ref);
  // allocate_sequence on an existing sequence reports min(length, prompt - 1).
  EXPECT_EQ(*cache_->allocate_sequence(1, {1, 2, 3}), 2);
  EXPECT_EQ(*cache_->allocate_sequence(1, std::vector<TokenId>(40, 3)), 11);
}

TEST_P(SeedCacheTest, AppendedButNotAdvancedPositionsAreNotPartOfTheSequence) {
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  RefSeq ref;
  append_advance(1, ref, 3);
  append(1, ref, 3);
  append(1, ref, 4);
  EXPECT_EQ(*cache_->sequence_length(1), 3);
  expect_onnx(1, ref);
  ASSERT_OK(cache_->advance_sequence_by(1, 2));
  ref.length = 5;
  expect_onnx(1, ref);
}

TEST_P(SeedCacheTest, AppendTokenPrefillAdvancedInPartsKeepsEveryPosition) {
  // Paged mode reserves ahead of the written positions while they grow (1, 2, 4, 8, 16 slots
  // here); only written positions advance, and the rest of the reservation is never visible.
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  RefSeq ref;
  for (int64_t p = 0; p < 13; ++p) append(1, ref, p);
  EXPECT_EQ(*cache_->sequence_length(1), 0);
  if (paged()) {
    EXPECT_EQ(cache_->advance_sequence_by(1, 14).code(), StatusCode::kFailedPrecondition);
    auto row = random_halves(kRow);
    EXPECT_EQ(cache_->append_token(1, 0, 14, row, row).code(), StatusCode::kOutOfRange);
  }
  ASSERT_OK(cache_->advance_sequence_by(1, 5));
  ref.length = 5;
  expect_onnx(1, ref);
  for (int64_t p = 13; p < 17; ++p) append(1, ref, p);
  EXPECT_OK(cache_->rollback_sequence(1, 5));  // same length: pending writes are kept
  ASSERT_OK(cache_->advance_sequence_by(1, 12));
  ref.length = 17;
  expect_onnx(1, ref);
  if (paged()) {
    EXPECT_EQ(*cache_->paged_cache()->pending(1), 0);  // nothing is reserved past the length
  }
  ASSERT_OK(cache_->rollback_sequence(1, 9));
  ref.length = 9;
  append_advance(1, ref, 3);
  expect_onnx(1, ref);
}

TEST_P(SeedCacheTest, HeadRangePrefillThenDecode) {
  ASSERT_OK(cache_->allocate_sequence(7, {1, 2, 3, 4, 5, 6, 7}));
  RefSeq ref;
  const int64_t n = 7;
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    for (int part = 0; part < 2; ++part)
      ref.rows[layer][part].assign(n, std::vector<uint16_t>(kRow));
    for (int32_t h = 0; h < kHeads; ++h) {
      auto k = random_halves(n * kDim), v = random_halves(n * kDim);
      ASSERT_OK(cache_->append_head_range_seq_first(7, layer, h, 0, k, v));
      for (int64_t p = 0; p < n; ++p)
        for (int64_t d = 0; d < kDim; ++d) {
          ref.rows[layer][0][p][h * kDim + d] = k[p * kDim + d];
          ref.rows[layer][1][p][h * kDim + d] = v[p * kDim + d];
        }
    }
  }
  ASSERT_OK(cache_->advance_sequence_by(7, n));
  ref.length = n;
  expect_onnx(7, ref);
  append_advance(7, ref, 2);
  expect_onnx(7, ref);
}

TEST_P(SeedCacheTest, LayerViewReadsTheLayer) {
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  RefSeq ref;
  append_advance(2, ref, 6);
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    auto view = cache_->get_layer_view(2, layer);
    ASSERT_OK(view);
    expect_view(*view, ref, layer);
    if (!paged()) {
      // Dense: zero-copy, the head stride is the buffer's capacity (4 doubled to 8).
      EXPECT_EQ(view->head_stride, 8 * kDim);
    } else {
      EXPECT_EQ(view->head_stride, 6 * kDim);
    }
  }
}

TEST_P(SeedCacheTest, PackedLayerIsCachedUntilTheNextWriteAndReusesItsBuffer) {
  ASSERT_OK(cache_->allocate_sequence(3, {}));
  RefSeq ref;
  append_advance(3, ref, 5);
  auto a = cache_->get_packed_layer(3, 1);
  ASSERT_OK(a);
  EXPECT_EQ(a->head_stride, 5 * kDim);
  expect_view(*a, ref, 1);
  EXPECT_EQ(cache_->stats().packed_layers, 1);
  auto b = cache_->get_packed_layer(3, 1);
  ASSERT_OK(b);
  EXPECT_EQ(a->key, b->key);
  // A write to the layer invalidates it; the rebuilt view lands in the same buffer (defect 10:
  // no fresh allocation per miss).
  append(3, ref, 5);
  EXPECT_EQ(cache_->stats().packed_layers, 0);
  ASSERT_OK(cache_->advance_sequence(3));
  ref.length = 6;
  auto c = cache_->get_packed_layer(3, 1);
  ASSERT_OK(c);
  EXPECT_EQ(c->key, a->key);
  expect_view(*c, ref, 1);
  auto d = cache_->get_packed_layer(3, 0);
  ASSERT_OK(d);
  expect_view(*d, ref, 0);
  EXPECT_EQ(cache_->stats().packed_layers, 2);
  // An empty sequence has no packed layer (the seed's None).
  ASSERT_OK(cache_->allocate_sequence(4, {}));
  EXPECT_EQ(cache_->get_packed_layer(4, 0).status().code(), StatusCode::kFailedPrecondition);
  auto empty = cache_->get_layer_as_onnx(4, 1);
  ASSERT_OK(empty);
  EXPECT_EQ(empty->shape[1], kHeads);
  EXPECT_EQ(empty->shape[2], 0);
  EXPECT_TRUE(empty->key.empty() && empty->value.empty());
}

TEST_P(SeedCacheTest, PackedLayerMissesReuseOneBuffer) {
  // Defect 10: every miss of the seed allocated fresh arrays. Here each miss (after a write and
  // an advance) lands in the same per-sequence buffer and holds the right bytes.
  ASSERT_OK(cache_->allocate_sequence(3, {}));
  RefSeq ref;
  append_advance(3, ref, 3);
  const void* keys[kLayers] = {nullptr, nullptr};
  for (int i = 0; i < 6; ++i) {
    const int32_t layer = i % kLayers;
    auto v = cache_->get_packed_layer(3, layer);
    ASSERT_OK(v);
    if (keys[layer] == nullptr) keys[layer] = v->key;
    EXPECT_EQ(v->key, keys[layer]) << "miss " << i << " moved the packed buffer";
    expect_view(*v, ref, layer);
    append(3, ref, ref.length);
    ASSERT_OK(cache_->advance_sequence(3));
    ++ref.length;
  }
}

TEST_P(SeedCacheTest, PackedBuffersOfARemovedSequenceServeTheNextOne) {
  // A removed sequence's packed buffers are kept for the next reads (paged mode): a new
  // sequence's first read allocates nothing and still reads its own bytes, not the old ones.
  if (!paged()) GTEST_SKIP() << "dense views are zero-copy";
  ASSERT_OK(cache_->allocate_sequence(3, {}));
  RefSeq old_ref;
  append_advance(3, old_ref, 6);
  auto old_view = cache_->get_packed_layer(3, 1);
  ASSERT_OK(old_view);
  const void* old_key = old_view->key;
  ASSERT_OK(cache_->remove_sequence(3));

  ASSERT_OK(cache_->allocate_sequence(4, {}));
  RefSeq ref;
  append_advance(4, ref, 5);  // shorter: fits the spare
  auto v = cache_->get_packed_layer(4, 0);
  ASSERT_OK(v);
  EXPECT_EQ(v->key, old_key) << "the spare buffer was not reused";
  expect_view(*v, ref, 0);
  // A longer read than any spare allocates; both layers read right.
  append_advance(4, ref, 20);
  auto longer = cache_->get_packed_layer(4, 1);
  ASSERT_OK(longer);
  expect_view(*longer, ref, 1);
  auto again = cache_->get_packed_layer(4, 0);
  ASSERT_OK(again);
  expect_view(*again, ref, 0);
}

TEST_P(SeedCacheTest, SetPackedLayerImportsOnlyThatLayer) {
  ASSERT_OK(cache_->allocate_sequence(5, {}));
  RefSeq ref;
  append_advance(5, ref, 6);
  ASSERT_OK(cache_->get_packed_layer(5, 0));  // cached, must be replaced
  auto k = random_halves(kHeads * 6 * kDim), v = random_halves(kHeads * 6 * kDim);
  ASSERT_OK(cache_->set_packed_layer(5, 0, 6, k, v));
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t d = 0; d < kDim; ++d) {
        ref.rows[0][0][p][h * kDim + d] = k[(h * 6 + p) * kDim + d];
        ref.rows[0][1][p][h * kDim + d] = v[(h * 6 + p) * kDim + d];
      }
  auto view = cache_->get_packed_layer(5, 0);
  ASSERT_OK(view);
  expect_view(*view, ref, 0);
  expect_onnx(5, ref);  // layer 1 untouched
  // A length other than the sequence's is rejected, not padded or truncated.
  auto k5 = random_halves(kHeads * 5 * kDim);
  EXPECT_EQ(cache_->set_packed_layer(5, 0, 5, k5, k5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->set_packed_layer(5, 0, 6, k5, k5).code(), StatusCode::kInvalidArgument);
  expect_onnx(5, ref);
}

TEST_P(SeedCacheTest, OverwriteLayerKeepsTheOtherLayers) {
  // Defect 3: the seed's paged overwrite_layer freed every block, losing the other layers.
  ASSERT_OK(cache_->allocate_sequence(6, {}));
  RefSeq ref;
  append_advance(6, ref, 7);
  // A KvTensor with spare capacity (10) holding 7 positions.
  auto k = random_halves(kHeads * 10 * kDim), v = random_halves(kHeads * 10 * kDim);
  ASSERT_OK(cache_->overwrite_layer(6, 1, k, v, 7, 10));
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t p = 0; p < 7; ++p)
      for (int64_t d = 0; d < kDim; ++d) {
        ref.rows[1][0][p][h * kDim + d] = k[(h * 10 + p) * kDim + d];
        ref.rows[1][1][p][h * kDim + d] = v[(h * 10 + p) * kDim + d];
      }
  expect_onnx(6, ref);
  // A shorter length shortens the sequence, like the seed's current_len = length.
  auto k4 = random_halves(kHeads * 4 * kDim), v4 = random_halves(kHeads * 4 * kDim);
  ASSERT_OK(cache_->overwrite_layer(6, 0, k4, v4, 4));
  ref.length = 4;
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t p = 0; p < 4; ++p)
      for (int64_t d = 0; d < kDim; ++d) {
        ref.rows[0][0][p][h * kDim + d] = k4[(h * 4 + p) * kDim + d];
        ref.rows[0][1][p][h * kDim + d] = v4[(h * 4 + p) * kDim + d];
      }
  expect_onnx(6, ref);
}

TEST_P(SeedCacheTest, OverwriteLayerFillsAFreshSequenceLayerByLayer) {
  ASSERT_OK(cache_->allocate_sequence(8, {}));
  RefSeq ref;
  ref.length = 9;
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    auto k = random_halves(kHeads * 9 * kDim), v = random_halves(kHeads * 9 * kDim);
    ASSERT_OK(cache_->overwrite_layer(8, layer, k, v, 9));
    for (int part = 0; part < 2; ++part)
      ref.rows[layer][part].assign(9, std::vector<uint16_t>(kRow));
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t p = 0; p < 9; ++p)
        for (int64_t d = 0; d < kDim; ++d) {
          ref.rows[layer][0][p][h * kDim + d] = k[(h * 9 + p) * kDim + d];
          ref.rows[layer][1][p][h * kDim + d] = v[(h * 9 + p) * kDim + d];
        }
  }
  expect_onnx(8, ref);
  append_advance(8, ref, 1);
  expect_onnx(8, ref);
}

TEST_P(SeedCacheTest, RollbackShortensAndAllowsRewriting) {
  ASSERT_OK(cache_->allocate_sequence(9, {}));
  RefSeq ref;
  append_advance(9, ref, 9);
  ASSERT_OK(cache_->get_packed_layer(9, 0));
  ASSERT_OK(cache_->rollback_sequence(9, 5));
  ref.length = 5;
  EXPECT_EQ(cache_->stats().packed_layers, 0);
  expect_onnx(9, ref);
  EXPECT_OK(cache_->rollback_sequence(9, 5));  // same length: no-op
  EXPECT_EQ(cache_->rollback_sequence(9, 6).code(), StatusCode::kOutOfRange);
  append_advance(9, ref, 3);
  expect_onnx(9, ref);
}

TEST_P(SeedCacheTest, BadInputsReturnErrorsAndChangeNothing) {
  // Defect 8: the seed panicked on unknown ids and out-of-range positions, zero-padded short
  // K/V and truncated long ones.
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  RefSeq ref;
  append_advance(1, ref, 3);
  auto row = random_halves(kRow);
  auto shorter = random_halves(kRow - 1), longer = random_halves(kRow + 1);
  EXPECT_EQ(cache_->append_token(99, 0, 0, row, row).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->append_token(1, kLayers, 3, row, row).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->append_token(1, -1, 3, row, row).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->append_token(1, 0, 3, shorter, row).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->append_token(1, 0, 3, row, longer).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->append_token(1, 0, 64, row, row).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->append_token(1, 0, -1, row, row).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->append_token(1, 0, 3, row, row, -5).code(), StatusCode::kInvalidArgument);
  auto odd = random_halves(kDim + 1);
  EXPECT_EQ(cache_->append_head_range_seq_first(1, 0, 0, 3, odd, odd).code(),
            StatusCode::kInvalidArgument);
  auto h2 = random_halves(2 * kDim), h1 = random_halves(kDim);
  EXPECT_EQ(cache_->append_head_range_seq_first(1, 0, kHeads, 3, h2, h2).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->append_head_range_seq_first(1, 0, 0, 3, h2, h1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->advance_sequence(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->advance_sequence_by(1, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->rollback_sequence(99, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->rollback_sequence(1, -1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->get_layer_view(99, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->get_layer_view(1, kLayers).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->get_packed_layer(99, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->get_layer_as_onnx(99, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->overwrite_layer(1, 0, row, row, 2, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->overwrite_layer(1, 0, row, row, 65).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->remove_sequence(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->sequence_length(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->set_sequence_priority(99, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->restore_offloaded_sequence(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->allocate_sequence(2, {1, -2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->allocate_sequence(2, std::vector<TokenId>(65, 1)).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_FALSE(cache_->has_sequence(2));
  if (paged()) {
    // Committed positions are immutable (they may be shared or cached); gaps are refused;
    // advancing past what was written is refused.
    EXPECT_EQ(cache_->append_token(1, 0, 1, row, row).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache_->append_token(1, 0, 5, row, row).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(cache_->advance_sequence(1).code(), StatusCode::kFailedPrecondition);
  }
  expect_onnx(1, ref);
  append_advance(1, ref, 1);
  expect_onnx(1, ref);
}

TEST_P(SeedCacheTest, RemoveSequenceForgetsIt) {
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  RefSeq ref;
  append_advance(1, ref, 5);
  ASSERT_OK(cache_->get_packed_layer(1, 0));
  EXPECT_EQ(cache_->stats().sequences, 1);
  ASSERT_OK(cache_->remove_sequence(1));
  EXPECT_FALSE(cache_->has_sequence(1));
  EXPECT_EQ(cache_->sequence_length(1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->remove_sequence(1).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->stats().sequences, 0);
  EXPECT_EQ(cache_->stats().packed_layers, 0);
  // The id can be allocated again, empty.
  EXPECT_EQ(*cache_->allocate_sequence(1, {4, 5}), 0);
  EXPECT_EQ(*cache_->sequence_length(1), 0);
}

TEST_P(SeedCacheTest, ActiveSetAndPriorityAreAccepted) {
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  EXPECT_OK(cache_->set_active_sequences({1}));
  EXPECT_OK(cache_->set_sequence_priority(1, 3));
  EXPECT_TRUE(cache_->drain_evicted_sequences().empty());
  EXPECT_OK(cache_->set_active_sequences({}));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, SeedCacheTest,
    ::testing::Combine(::testing::Values(CacheMode::kPaged, CacheMode::kDense),
                       testing::runtime_backends()),
    [](const ::testing::TestParamInfo<std::tuple<CacheMode, BackendKind>>& info) {
      return std::string(std::get<0>(info.param) == CacheMode::kPaged ? "Paged" : "Dense") + "_" +
             testing::backend_label(std::get<1>(info.param));
    });

}  // namespace
}  // namespace pagedkv
