// SeedKvCache behaviour that belongs to one mode: paged prefix reuse after removal, offload and
// asynchronous restore, eviction reporting and stats, the cost of an append_token prefill and
// the packed buffers' size; dense growth, zero-copy views and the capped free list. On both
// backends (runtime_backends.hpp) except where a test needs a CPU-only memory limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/seed_cache.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/forwarding_backend.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 2;
constexpr int32_t kDim = 8;
constexpr int64_t kRow = kHeads * kDim;

CacheConfig config_for(CacheMode mode) {
  CacheConfig c;
  c.mode = mode;
  c.num_layers = kLayers;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = 4;
  c.num_device_blocks = 16;
  c.num_host_blocks = 16;
  c.max_sequence_length = 64;
  c.dense_initial_length = 4;
  c.dense_max_free_buffers = 1;
  c.backend = BackendKind::kCpu;
  return c;
}

// Forwards every call to another backend and keeps the bytes of the live device allocations
// made through it and their peak, so a test can see what a call allocated.
class DeviceBytesBackend final : public testing::ForwardingBackend {
 public:
  explicit DeviceBytesBackend(Backend& inner) : ForwardingBackend(inner) {}
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_; }

  StatusOr<void*> allocate_device(size_t bytes) override {
    auto p = inner().allocate_device(bytes);
    if (p.ok()) {
      sizes_[*p] = bytes;
      live_ += static_cast<int64_t>(bytes);
      peak_ = std::max(peak_, live_);
    }
    return p;
  }
  void free_device(void* ptr) override {
    auto it = sizes_.find(ptr);
    if (it != sizes_.end()) {
      live_ -= static_cast<int64_t>(it->second);
      sizes_.erase(it);
    }
    inner().free_device(ptr);
  }

 private:
  std::unordered_map<void*, size_t> sizes_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

class SeedModesFixture : public ::testing::Test {
 protected:
  // `options` shape the CPU backend only (testing::make_backend).
  void make(CacheConfig config, const CpuBackendOptions& options = {}) {
    cache_.reset();
    config.backend = kind_;
    backend_ = testing::make_backend(kind_, options);
    ASSERT_NE(backend_, nullptr);
    SeedKvCacheOptions o;
    o.backend = backend_.get();
    auto c = SeedKvCache::create(config, o);
    ASSERT_OK(c);
    cache_ = std::move(c).value();
  }

  std::vector<uint16_t> random_halves(size_t n) {
    std::uniform_real_distribution<float> mag(0.125f, 4.0f);
    std::vector<uint16_t> out(n);
    for (auto& x : out) x = float_to_half_bits(rng_() % 2 ? mag(rng_) : -mag(rng_));
    return out;
  }

  // Appends `tokens` (every layer, token ids given) at positions 0, 1, ... and advances after
  // each (without `advance`: never, a prefill through append_token); calls `after(pos)` once a
  // position is written. Returns the per-layer [heads, len, dim] keys and values written.
  struct Layers {
    std::vector<uint16_t> key[kLayers], value[kLayers];
  };
  Layers write(SequenceId id, const std::vector<TokenId>& tokens, bool advance = true,
               const std::function<void(int64_t)>& after = nullptr) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    Layers out;
    for (int32_t l = 0; l < kLayers; ++l) {
      out.key[l].resize(static_cast<size_t>(n * kRow));
      out.value[l].resize(out.key[l].size());
    }
    for (int64_t p = 0; p < n; ++p) {
      for (int32_t l = 0; l < kLayers; ++l) {
        auto k = random_halves(kRow), v = random_halves(kRow);
        EXPECT_OK(cache_->append_token(id, l, p, k, v, tokens[static_cast<size_t>(p)]));
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t d = 0; d < kDim; ++d) {
            out.key[l][static_cast<size_t>((h * n + p) * kDim + d)] = k[h * kDim + d];
            out.value[l][static_cast<size_t>((h * n + p) * kDim + d)] = v[h * kDim + d];
          }
      }
      if (advance) {
        EXPECT_OK(cache_->advance_sequence(id));
      }
      if (after) after(p);
    }
    return out;
  }

  // The first `len` positions of `id` equal those of `want` (written with length `n`).
  void expect_prefix(SequenceId id, const Layers& want, int64_t n, int64_t len) {
    for (int32_t l = 0; l < kLayers; ++l) {
      auto onnx = cache_->get_layer_as_onnx(id, l);
      ASSERT_OK(onnx);
      ASSERT_EQ(onnx->shape[2], len);
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t p = 0; p < len; ++p)
          for (int64_t d = 0; d < kDim; ++d) {
            const size_t got = static_cast<size_t>((h * len + p) * kDim + d);
            const size_t exp = static_cast<size_t>((h * n + p) * kDim + d);
            ASSERT_EQ(onnx->key[got], want.key[l][exp]) << "layer " << l << " pos " << p;
            ASSERT_EQ(onnx->value[got], want.value[l][exp]) << "layer " << l << " pos " << p;
          }
    }
  }

  BackendKind kind_ = BackendKind::kCpu;
  std::mt19937 rng_{99};
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<SeedKvCache> cache_;
};

// On both backends.
class SeedModesTest : public SeedModesFixture, public ::testing::WithParamInterface<BackendKind> {
 protected:
  void SetUp() override {
    kind_ = GetParam();
    testing::require_backend(kind_);
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, SeedModesTest, testing::runtime_backends(),
                         testing::backend_param_name);

// CPU backend only: the test needs a CpuBackendOptions memory limit.
class SeedModesCpuTest : public SeedModesFixture {};

TEST_P(SeedModesTest, PagedPrefixOutlivesTheSequenceThatWroteIt) {
  // Seed defect 6 is absent through the wrapper too: removal keeps full blocks cached.
  make(config_for(CacheMode::kPaged));
  const std::vector<TokenId> prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  ASSERT_EQ(*cache_->allocate_sequence(1, prompt), 0);
  Layers written = write(1, prompt);
  ASSERT_OK(cache_->remove_sequence(1));
  EXPECT_FALSE(cache_->has_sequence(1));
  auto cached = cache_->allocate_sequence(2, prompt);
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 8);  // two full blocks, at least one token left to compute
  EXPECT_EQ(*cache_->sequence_length(2), 8);
  expect_prefix(2, written, 9, 8);
  // Writing the recomputed last token does not touch the cached blocks (copy-on-write).
  auto k = random_halves(kRow), v = random_halves(kRow);
  for (int32_t l = 0; l < kLayers; ++l) ASSERT_OK(cache_->append_token(2, l, 8, k, v, 19));
  ASSERT_OK(cache_->advance_sequence(2));
  EXPECT_EQ(*cache_->allocate_sequence(3, prompt), 8);
  expect_prefix(3, written, 9, 8);
}

TEST_P(SeedModesTest, PagedOffloadAndAsynchronousRestoreKeepTheBytes) {
  CpuBackendOptions slow;
  slow.copy_delay = std::chrono::microseconds(2000);  // restore copies finish late
  make(config_for(CacheMode::kPaged), slow);
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  const std::vector<TokenId> toks = {1, 2, 3, 4, 5, 6};
  Layers written = write(1, toks);
  ASSERT_OK(cache_->paged_cache()->offload(1));
  ASSERT_OK(cache_->synchronize());
  EXPECT_TRUE(cache_->has_sequence(1));
  EXPECT_GT(cache_->stats().cpu_offloaded_blocks, 0);
  EXPECT_EQ(cache_->get_packed_layer(1, 0).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(cache_->restore_offloaded_sequence(1));  // queued, not waited for
  EXPECT_EQ(cache_->restore_offloaded_sequence(1).code(), StatusCode::kFailedPrecondition);
  expect_prefix(1, written, 6, 6);  // reads on the compute stream wait for the copies
  // allocate_sequence restores an offloaded sequence too, like the seed.
  ASSERT_OK(cache_->paged_cache()->offload(1));
  EXPECT_NE(*cache_->paged_cache()->residency(1), SequenceResidency::kDevice);
  EXPECT_EQ(*cache_->allocate_sequence(1, {1, 2, 3, 4, 5, 6, 7, 8}), 6);
  expect_prefix(1, written, 6, 6);
}

TEST_P(SeedModesTest, PagedEvictionIsReportedAndActiveSequencesAreProtected) {
  CacheConfig c = config_for(CacheMode::kPaged);
  c.num_device_blocks = 4;
  c.num_host_blocks = 0;  // nowhere to offload: inactive sequences are dropped
  c.enable_prefix_caching = false;
  make(c);
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  write(1, std::vector<TokenId>(8, 3));  // 2 blocks
  ASSERT_OK(cache_->set_active_sequences({1, 2}));
  write(2, std::vector<TokenId>(8, 4));  // the other 2 blocks
  // Sequence 2 needs a fifth block; both are active, so nothing may be taken.
  auto row = random_halves(kRow);
  EXPECT_EQ(cache_->append_token(2, 0, 8, row, row).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(*cache_->sequence_length(2), 8);
  ASSERT_OK(cache_->set_active_sequences({2}));
  ASSERT_OK(cache_->set_sequence_priority(1, 0));
  ASSERT_OK(cache_->append_token(2, 0, 8, row, row));
  EXPECT_EQ(cache_->drain_evicted_sequences(), std::vector<SequenceId>{1});
  EXPECT_TRUE(cache_->drain_evicted_sequences().empty());
  EXPECT_FALSE(cache_->has_sequence(1));
  const SeedKvCacheStats s = cache_->stats();
  EXPECT_EQ(s.mode, CacheMode::kPaged);
  EXPECT_EQ(s.evicted_sequences, 1);
  EXPECT_EQ(s.blocks_total, 4);
  EXPECT_EQ(s.sequences, 1);
  EXPECT_EQ(s.bytes_capacity, 4 * c.block_bytes());
  EXPECT_EQ(s.bytes_used, 3 * c.block_bytes());
  EXPECT_EQ(s.blocks_free, 1);
}

TEST_P(SeedModesTest, PagedAppendTokenPrefillReservesLinearly) {
  // Issue "Step path", item 5: each append_token one past the written positions re-reserved
  // every pending position, so an n-token prefill handed out n^2 / 2 slots. The reservation
  // now grows geometrically; what is reserved ahead stays unwritten and invisible.
  CacheConfig c = config_for(CacheMode::kPaged);
  c.block_size = 16;
  c.max_sequence_length = 8192;
  c.num_device_blocks = 1024;
  make(c);
  constexpr int64_t n = 4096;
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  KvCache& kv = *cache_->paged_cache();
  std::vector<TokenId> tokens(n);
  for (int64_t p = 0; p < n; ++p) tokens[static_cast<size_t>(p)] = static_cast<TokenId>(p % 997);
  // Nothing is committed during the prefill, so the reservation changes only through a
  // reserve, which hands out `pending` slots.
  int64_t reserves = 0, reserved_slots = 0, pending = 0;
  const auto start = std::chrono::steady_clock::now();
  Layers written = write(1, tokens, /*advance=*/false, [&](int64_t p) {
    const int64_t now = *kv.pending(1);
    EXPECT_GE(now, p + 1);
    if (now != pending) {
      ++reserves;
      reserved_slots += now;
      pending = now;
    }
  });
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("append_token prefill of %lld tokens: %lld reserves, %lld slots, %.1f ms\n",
              static_cast<long long>(n), static_cast<long long>(reserves),
              static_cast<long long>(reserved_slots), ms);
  EXPECT_LE(reserved_slots, 4 * n);
  EXPECT_LE(reserves, 2 * 12 + 4);  // log2(4096) doublings, with room to spare
  EXPECT_EQ(*cache_->sequence_length(1), 0);
  // Positions reserved ahead are not written: advancing over them or writing past the written
  // ones is refused as before.
  EXPECT_EQ(cache_->advance_sequence_by(1, n + 1).code(), StatusCode::kFailedPrecondition);
  auto row = random_halves(kRow);
  EXPECT_EQ(cache_->append_token(1, 0, n + 1, row, row).code(), StatusCode::kOutOfRange);
  ASSERT_OK(cache_->advance_sequence_by(1, n));
  EXPECT_EQ(*kv.pending(1), 0);  // nothing stays reserved past the length
  EXPECT_EQ(cache_->stats().blocks_free, c.num_device_blocks - n / c.block_size);
  expect_prefix(1, written, n, n);
  ASSERT_OK(kv.check_invariants());
}

TEST_P(SeedModesTest, PagedPrefillReservesAheadOnlyFromFreeBlocks) {
  // Reserving ahead never evicts a cached prefix or offloads another sequence: a prefill that
  // fills the pool to the last block behaves as if it reserved one position at a time.
  make(config_for(CacheMode::kPaged));  // 16 device blocks of 4
  const std::vector<TokenId> prompt = {11, 12, 13, 14, 15, 16, 17, 18};
  ASSERT_OK(cache_->allocate_sequence(1, prompt));
  Layers cached = write(1, prompt);
  ASSERT_OK(cache_->remove_sequence(1));  // 2 cached blocks
  ASSERT_OK(cache_->allocate_sequence(3, {}));
  Layers other = write(3, std::vector<TokenId>(8, 21));  // 2 blocks
  ASSERT_OK(cache_->allocate_sequence(2, {}));
  std::vector<TokenId> tokens(48);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(100 + i);
  Layers prefill = write(2, tokens, /*advance=*/false);  // 12 blocks: the pool is full
  SeedKvCacheStats s = cache_->stats();
  EXPECT_EQ(s.blocks_free, 0);
  EXPECT_EQ(s.evicted_blocks, 0);
  EXPECT_EQ(s.evicted_sequences, 0);
  EXPECT_EQ(s.cpu_offloaded_blocks, 0);
  EXPECT_EQ(*cache_->paged_cache()->residency(3), SequenceResidency::kDevice);
  ASSERT_OK(cache_->advance_sequence_by(2, 48));
  expect_prefix(2, prefill, 48, 48);
  expect_prefix(3, other, 8, 8);
  std::vector<TokenId> again = prompt;
  again.push_back(19);
  EXPECT_EQ(*cache_->allocate_sequence(4, again), 8);
  expect_prefix(4, cached, 8, 8);
}

TEST_P(SeedModesTest, PagedPackedLayerHoldsOnlyTheLayerRead) {
  // Issue "Step path", item 5: the packed buffers held every layer, rounded up to a power of
  // two positions, whichever layer was read. A read now allocates that layer, in 16-position
  // steps.
  CacheConfig c = config_for(CacheMode::kPaged);
  c.num_layers = 8;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.block_size = 16;
  c.max_sequence_length = 4096;
  constexpr int64_t n = 3000;
  c.num_device_blocks = n / 16 + 4;
  std::unique_ptr<Backend> inner = testing::make_backend(kind_);
  ASSERT_NE(inner, nullptr);
  DeviceBytesBackend counted(*inner);
  SeedKvCacheOptions o;
  o.backend = &counted;
  auto created = SeedKvCache::create(c, o);
  ASSERT_OK(created);
  std::unique_ptr<SeedKvCache> seed = std::move(created).value();
  ASSERT_OK(seed->allocate_sequence(1, {}));
  const size_t elems = static_cast<size_t>(c.num_kv_heads) * n * c.head_dim;
  std::vector<std::vector<uint16_t>> keys, values;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    keys.emplace_back(elems);
    values.emplace_back(elems);
    for (size_t i = 0; i < elems; ++i) {
      keys.back()[i] = static_cast<uint16_t>(0x3c00 | (rng_() & 0x3ff));
      values.back()[i] = static_cast<uint16_t>(0xbc00 | (rng_() & 0x3ff));
    }
    ASSERT_OK(seed->overwrite_layer(1, l, keys.back(), values.back(), n));
  }
  ASSERT_OK(seed->synchronize());
  const int64_t layer_bytes = int64_t{2} * static_cast<int64_t>(elems) * 2;  // K and V
  const int64_t step_bytes = int64_t{2} * c.num_kv_heads * 16 * c.head_dim * 2;
  const int64_t before = counted.live();
  counted.reset_peak();
  for (int32_t l : {5, 2}) {
    auto view = seed->get_packed_layer(1, l);
    ASSERT_OK(view);
    ASSERT_OK(seed->synchronize());
    // Packed: [heads, n, head_dim] in one range each, copied out as a whole.
    ASSERT_EQ(view->head_stride, n * c.head_dim);
    std::vector<uint16_t> k(elems), v(elems);
    ASSERT_OK(inner->copy_async(k.data(), view->key, elems * 2, CopyKind::kDeviceToHost, Stream{}));
    ASSERT_OK(
        inner->copy_async(v.data(), view->value, elems * 2, CopyKind::kDeviceToHost, Stream{}));
    ASSERT_OK(inner->synchronize_stream(Stream{}));
    EXPECT_TRUE(k == keys[static_cast<size_t>(l)]) << "layer " << l;
    EXPECT_TRUE(v == values[static_cast<size_t>(l)]) << "layer " << l;
  }
  std::printf("packed: read %lld bytes per layer, peak %lld bytes for two layers\n",
              static_cast<long long>(layer_bytes), static_cast<long long>(counted.peak() - before));
  EXPECT_LE(counted.peak() - before, 2 * (layer_bytes + step_bytes));
  EXPECT_EQ(seed->stats().packed_layers, 2);
  // Past the buffer's capacity a read regrows that layer only, freeing the old buffer first.
  for (int64_t p = n; p < n + 16; ++p) {
    for (int32_t l = 0; l < c.num_layers; ++l) {
      std::vector<uint16_t> row(static_cast<size_t>(c.num_kv_heads) * c.head_dim, 0x3c01);
      ASSERT_OK(seed->append_token(1, l, p, row, row));
    }
  }
  ASSERT_OK(seed->advance_sequence_by(1, 16));
  ASSERT_OK(seed->synchronize());
  const int64_t held = counted.live();
  counted.reset_peak();
  ASSERT_OK(seed->get_packed_layer(1, 5));
  EXPECT_EQ(counted.peak(), counted.live());
  EXPECT_LE(counted.live() - held, layer_bytes / 2);
  // Removal keeps the two packed buffers as spares for the next sequence (up to 64 MiB), and
  // that sequence's read of the same size allocates nothing.
  ASSERT_OK(seed->remove_sequence(1));
  const int64_t spares = counted.live() - before;
  EXPECT_LE(spares, 2 * (layer_bytes + step_bytes) + layer_bytes / 2);
  ASSERT_OK(seed->allocate_sequence(2, {}));
  ASSERT_OK(seed->overwrite_layer(2, 5, keys[5], values[5], n));
  const int64_t with_second = counted.live();
  ASSERT_OK(seed->get_packed_layer(2, 5));
  EXPECT_EQ(counted.live(), with_second) << "the spare buffer was not reused";
  ASSERT_OK(seed->remove_sequence(2));
}

TEST_P(SeedModesTest, DenseBufferGrowsByDoublingAndViewsAreZeroCopy) {
  make(config_for(CacheMode::kDense));
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  const int64_t per_pos = int64_t{kLayers} * 2 * kRow * 2;  // bytes per position
  EXPECT_EQ(cache_->stats().bytes_used, 4 * per_pos);
  std::vector<TokenId> toks(9, 1);
  Layers written = write(1, toks);
  EXPECT_EQ(cache_->stats().bytes_used, 16 * per_pos);  // 4 -> 8 -> 16
  auto a = cache_->get_layer_view(1, 1);
  auto b = cache_->get_layer_view(1, 1);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->key, b->key);
  EXPECT_EQ(a->head_stride, 16 * kDim);
  EXPECT_EQ(cache_->stats().packed_layers, 0);  // a layer view packs nothing in dense mode
  expect_prefix(1, written, 9, 9);
  // Dense mode may rewrite a committed position, like the seed.
  auto k = random_halves(kRow), v = random_halves(kRow);
  ASSERT_OK(cache_->append_token(1, 0, 2, k, v));
  auto onnx = cache_->get_layer_as_onnx(1, 0);
  ASSERT_OK(onnx);
  EXPECT_EQ(onnx->key[static_cast<size_t>(2 * kDim)], k[0]);
  EXPECT_EQ(onnx->value[static_cast<size_t>((9 + 2) * kDim)], v[kDim]);  // head 1, pos 2
  EXPECT_EQ(cache_->restore_offloaded_sequence(1).code(), StatusCode::kFailedPrecondition);
}

TEST_P(SeedModesTest, DenseFreeListIsCappedAndReused) {
  make(config_for(CacheMode::kDense));                      // dense_max_free_buffers = 1
  const int64_t buf = int64_t{kLayers} * 2 * kRow * 2 * 4;  // one initial buffer
  for (SequenceId id = 1; id <= 3; ++id) ASSERT_OK(cache_->allocate_sequence(id, {}));
  EXPECT_EQ(cache_->stats().bytes_capacity, 3 * buf);
  for (SequenceId id = 1; id <= 3; ++id) ASSERT_OK(cache_->remove_sequence(id));
  SeedKvCacheStats s = cache_->stats();
  EXPECT_EQ(s.sequences, 0);
  EXPECT_EQ(s.bytes_used, 0);
  EXPECT_EQ(s.bytes_capacity, buf);  // one kept, two freed
  ASSERT_OK(cache_->allocate_sequence(4, {}));
  EXPECT_EQ(cache_->stats().bytes_capacity, buf);  // reused, nothing new
  EXPECT_EQ(cache_->stats().bytes_used, buf);
}

TEST_F(SeedModesCpuTest, DenseFailedGrowthKeepsTheData) {
  CacheConfig c = config_for(CacheMode::kDense);
  CpuBackendOptions o;
  // Room for the upload ring (2 x 1 MiB: staging is pinned, the device copy is not) plus the
  // initial buffer and a little: a growth to 8 positions cannot be had.
  const size_t buf = static_cast<size_t>(kLayers) * 2 * kRow * 2 * 4;
  o.device_memory_limit = (1u << 20) + buf + buf / 2;
  make(c, o);
  ASSERT_OK(cache_->allocate_sequence(1, {}));
  Layers written = write(1, {1, 2, 3, 4});
  auto row = random_halves(kRow);
  EXPECT_EQ(cache_->append_token(1, 0, 4, row, row).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache_->advance_sequence(1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(*cache_->sequence_length(1), 4);
  // The packed mirror cannot be had either, but the zero-copy view still reads the data.
  auto view = cache_->get_layer_view(1, 0);
  ASSERT_OK(view);
  EXPECT_EQ(view->length, 4);
}

TEST_F(SeedModesCpuTest, CreateRejectsNonFp16AndBadConfigs) {
  CacheConfig c = config_for(CacheMode::kPaged);
  c.dtype = DType::kFloat32;
  EXPECT_EQ(SeedKvCache::create(c).status().code(), StatusCode::kInvalidArgument);
  c = config_for(CacheMode::kDense);
  c.dense_initial_length = 0;
  EXPECT_EQ(SeedKvCache::create(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedkv
