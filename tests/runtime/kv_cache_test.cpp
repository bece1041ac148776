// KvCache end to end on real bytes: write, commit, gather; prefix reuse; offload, reuse of the
// freed device blocks and restore (with a slow copy worker on the CPU backend); residency; bad
// calls. On both backends (runtime_backends.hpp) except where a test needs a CPU-only knob or
// reads device memory from the host.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/gated_transfers.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

CacheConfig small_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.block_size = 4;
  c.num_device_blocks = 12;
  c.num_host_blocks = 12;
  c.dtype = DType::kFloat16;
  c.backend = BackendKind::kCpu;
  return c;
}

std::vector<TokenId> iota_tokens(int n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

class KvCacheFixture : public ::testing::Test {
 protected:
  // `options` shape the CPU backend only (testing::make_backend). `gated`: the cache runs on a
  // GatedTransfers wrapper (gated_), whose arm() holds its copies until release().
  void make(CacheConfig config, const CpuBackendOptions& options = {}, bool gated = false) {
    cache_.reset();
    gated_.reset();
    config.backend = kind_;
    config_ = config;
    backend_ = testing::make_backend(kind_, options);
    ASSERT_NE(backend_, nullptr);
    KvCacheOptions o;
    o.backend = backend_.get();
    if (gated) {
      gated_ = std::make_unique<testing::GatedTransfers>(*backend_);
      o.backend = gated_.get();
    }
    auto c = KvCache::create(config, o);
    ASSERT_OK(c);
    cache_ = std::move(c).value();
  }

  // Reserves, writes every layer and commits `tokens` (at positions start..) for `id`.
  void append(SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    auto slots = cache_->reserve(id, static_cast<int64_t>(tokens.size()));
    ASSERT_OK(slots);
    ASSERT_EQ(slots->size(), tokens.size());
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<uint16_t> k = model_rows(config_, layer, 0, tokens, start);
      const std::vector<uint16_t> v = model_rows(config_, layer, 1, tokens, start);
      DeviceBuffer dk(*backend_, k.size() * 2), dv(*backend_, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      ASSERT_OK(cache_->write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16));
      ASSERT_OK(cache_->synchronize());  // the staging buffers go out of scope
    }
    ASSERT_OK(cache_->commit(id, tokens));
    ASSERT_OK(cache_->check_invariants());
  }

  // Gathers every layer of `id` and compares every element with kv_value of `tokens`.
  void expect_contents(SequenceId id, const std::vector<TokenId>& tokens) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const size_t elems = static_cast<size_t>(n * config_.num_kv_heads * config_.head_dim);
      DeviceBuffer k(*backend_, elems * 2), v(*backend_, elems * 2);
      const Status s = cache_->gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                            PackedLayout::kHeadMajor);
      ASSERT_OK(s);
      ASSERT_OK(cache_->synchronize());
      const std::vector<uint16_t> gk = k.download<uint16_t>(), gv = v.download<uint16_t>();
      for (int32_t h = 0; h < config_.num_kv_heads; ++h)
        for (int64_t t = 0; t < n; ++t)
          for (int32_t d = 0; d < config_.head_dim; ++d) {
            const size_t i = static_cast<size_t>((h * n + t) * config_.head_dim + d);
            const TokenId tok = tokens[static_cast<size_t>(t)];
            ASSERT_EQ(gk[i], kv_value(t, tok, layer, 0, h, d))
                << "seq " << id << " layer " << layer << " head " << h << " pos " << t;
            ASSERT_EQ(gv[i], kv_value(t, tok, layer, 1, h, d));
          }
    }
  }

  std::set<int32_t> device_blocks(SequenceId id) {
    std::set<int32_t> out;
    auto batch = cache_->build_batch({id});
    EXPECT_OK(batch);
    if (!batch.ok()) return out;
    const BatchMetadata& m = *batch->host;
    for (int32_t i = 0; i < m.max_blocks; ++i) {
      const int32_t b = m.block_tables[static_cast<size_t>(i)];
      if (b >= 0) out.insert(b);
    }
    return out;
  }

  // Offloads A, reuses its freed device blocks for B at once, then restores each in turn: both
  // read back bit-exact. With `slow_copies` (CPU backend, 30 ms per copy) A's offload is still
  // in flight when B writes into its former blocks.
  void offload_reuse_restore(bool slow_copies) {
    CpuBackendOptions slow;
    slow.copy_delay = std::chrono::milliseconds(30);
    CacheConfig c = small_config();
    c.num_device_blocks = 4;  // room for one 12-token sequence at a time
    make(c, slow_copies ? slow : CpuBackendOptions{}, slow_copies);
    const std::vector<TokenId> a = iota_tokens(12, 1000), b = iota_tokens(12, 2000);
    ASSERT_OK(cache_->add_sequence(1, a));
    append(1, a, 0);
    const std::set<int32_t> a_blocks = device_blocks(1);
    ASSERT_EQ(a_blocks.size(), 3u);

    if (slow_copies) gated_->arm();
    ASSERT_OK(cache_->offload(1));
    if (slow_copies) {
      EXPECT_EQ(*cache_->residency(1), SequenceResidency::kInFlight);  // held at the gate
      gated_->release();  // and then sleeping while B writes into A's former blocks
    }
    ASSERT_OK(cache_->add_sequence(2, b));
    append(2, b, 0);  // 3 blocks out of 4: at least two were A's
    int reused = 0;
    for (int32_t blk : device_blocks(2)) reused += a_blocks.count(blk) ? 1 : 0;
    EXPECT_GE(reused, 2);

    ASSERT_OK(cache_->restore(1));  // offloads B (inactive) to make room
    ASSERT_OK(cache_->check_invariants());
    expect_contents(1, a);
    ASSERT_OK(cache_->restore(2));  // and back again
    expect_contents(2, b);
    const ControlStats stats = cache_->stats();
    EXPECT_EQ(stats.sequences_offloaded, 3);
    EXPECT_EQ(stats.sequences_restored, 2);
    ASSERT_OK(cache_->check_invariants());
  }

  BackendKind kind_ = BackendKind::kCpu;
  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<testing::GatedTransfers> gated_;  // between the backend and the cache
  std::unique_ptr<KvCache> cache_;
};

// On both backends.
class KvCacheTest : public KvCacheFixture, public ::testing::WithParamInterface<BackendKind> {
 protected:
  void SetUp() override {
    kind_ = GetParam();
    testing::require_backend(kind_);
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, KvCacheTest, testing::runtime_backends(),
                         testing::backend_param_name);

// CPU backend only: the test needs a CpuBackendOptions knob, or reads device memory from the host.
class KvCacheCpuTest : public KvCacheFixture {};

TEST_P(KvCacheTest, CreateReportsPoolBytes) {
  make(small_config());
  EXPECT_EQ(cache_->pool_info().device_bytes, small_config().block_bytes() * 12);
  EXPECT_EQ(cache_->pool_info().host_bytes, small_config().block_bytes() * 12);
}

TEST_F(KvCacheCpuTest, CreateRejectsBadConfigAndTooLargePools) {
  CacheConfig bad = small_config();
  bad.head_dim = 0;
  EXPECT_EQ(KvCache::create(bad).status().code(), StatusCode::kInvalidArgument);
  CpuBackendOptions limited;
  limited.device_memory_limit = 1 << 16;  // far below 12 blocks
  auto backend = create_cpu_backend(limited);
  KvCacheOptions o;
  o.backend = backend.get();
  EXPECT_EQ(KvCache::create(small_config(), o).status().code(), StatusCode::kResourceExhausted);
}

TEST_P(KvCacheTest, WriteCommitGatherRoundTrip) {
  make(small_config());
  const std::vector<TokenId> prompt = iota_tokens(10, 100);
  ASSERT_EQ(*cache_->add_sequence(1, prompt), 0);
  append(1, prompt, 0);
  expect_contents(1, prompt);
  std::vector<TokenId> all = prompt;
  for (int step = 0; step < 5; ++step) {  // decode: one token at a time
    const TokenId next = 500 + step;
    append(1, {next}, static_cast<int64_t>(all.size()));
    all.push_back(next);
  }
  expect_contents(1, all);
}

TEST_P(KvCacheTest, FinishedPrefixIsReusedWithItsBytes) {
  make(small_config());
  const std::vector<TokenId> prompt = iota_tokens(9, 7);
  ASSERT_OK(cache_->add_sequence(1, prompt));
  append(1, prompt, 0);
  ASSERT_OK(cache_->finish(1));

  std::vector<TokenId> second = prompt;
  second.push_back(99);
  auto cached = cache_->add_sequence(2, second);
  ASSERT_OK(cached);
  EXPECT_EQ(*cached, 8);  // two full blocks of 4; at least one token is left to compute
  append(2, std::vector<TokenId>(second.begin() + 8, second.end()), 8);
  expect_contents(2, second);
}

// The central ordering case, with a copy worker that sleeps 30 ms per copy: the freed device
// blocks of an offloaded sequence are reused at once by another sequence's writes; both must
// read back bit-exact after restores that, in turn, offload the other one.
TEST_F(KvCacheCpuTest, OffloadReuseRestoreWithSlowCopies) { offload_reuse_restore(true); }

// The same on each backend's own copy timing.
TEST_P(KvCacheTest, OffloadReuseRestore) { offload_reuse_restore(false); }

TEST_F(KvCacheCpuTest, ResidencyFollowsOffloadAndRestore) {
  make(small_config(), {}, /*gated=*/true);
  const std::vector<TokenId> a = iota_tokens(8, 1);
  ASSERT_OK(cache_->add_sequence(1, a));
  append(1, a, 0);
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kDevice);
  gated_->arm();
  ASSERT_OK(cache_->offload(1));
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kInFlight);  // its copies are held
  gated_->release();
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kHost);
  EXPECT_EQ(cache_->gather_layer(1, 0, nullptr, nullptr, DType::kFloat16, PackedLayout::kHeadMajor)
                .code(),
            StatusCode::kFailedPrecondition);
  gated_->arm();
  ASSERT_OK(cache_->restore(1));
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kInFlight);
  gated_->release();
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kDevice);
  expect_contents(1, a);
  EXPECT_EQ(cache_->residency(42).status().code(), StatusCode::kNotFound);
}

// Residency on each backend's own copy timing: kHost once the offload is waited for, kDevice
// once the restore is.
TEST_P(KvCacheTest, ResidencyAfterWaitedOffloadAndRestore) {
  make(small_config());
  const std::vector<TokenId> a = iota_tokens(8, 1);
  ASSERT_OK(cache_->add_sequence(1, a));
  append(1, a, 0);
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kDevice);
  ASSERT_OK(cache_->offload(1));
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kHost);
  ASSERT_OK(cache_->restore(1));
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(*cache_->residency(1), SequenceResidency::kDevice);
  expect_contents(1, a);
}

// An attention kernel's view of a step: both metadata forms address every committed element of
// every sequence of the batch (the CPU backend's "device" memory is readable by the host).
TEST_F(KvCacheCpuTest, DeviceViewOfABatchReadsEverySequence) {
  make(small_config());
  const std::vector<TokenId> a = iota_tokens(9, 10), b = iota_tokens(6, 40);
  ASSERT_OK(cache_->add_sequence(1, a));
  append(1, a, 0);
  ASSERT_OK(cache_->add_sequence(2, b));
  append(2, b, 0);
  for (bool csr : {false, true}) {
    BatchOptions options;
    options.build_csr = csr;
    auto batch = cache_->build_batch({2, 1}, options);
    ASSERT_OK(batch);
    ASSERT_OK(cache_->synchronize());  // the metadata upload
    const device::PagedKvView view = cache_->device_view(*batch);
    EXPECT_EQ(view.is_csr(), csr);
    ASSERT_EQ(view.batch_size, 2);
    const std::vector<TokenId>* tokens[] = {&b, &a};
    for (int32_t s = 0; s < 2; ++s) {
      ASSERT_EQ(view.seq_len(s), static_cast<int64_t>(tokens[s]->size()));
      for (int64_t pos = 0; pos < view.seq_len(s); ++pos)
        for (int32_t layer = 0; layer < config_.num_layers; ++layer)
          for (int32_t h = 0; h < config_.num_kv_heads; ++h)
            for (int32_t d = 0; d < config_.head_dim; d += 7) {
              const TokenId tok = (*tokens[s])[static_cast<size_t>(pos)];
              const auto* k =
                  static_cast<const uint16_t*>(view.address(s, layer, KvPart::kKey, h, pos));
              const auto* v =
                  static_cast<const uint16_t*>(view.address(s, layer, KvPart::kValue, h, pos));
              ASSERT_EQ(k[d], kv_value(pos, tok, layer, 0, h, d)) << "csr " << csr << " seq " << s;
              ASSERT_EQ(v[d], kv_value(pos, tok, layer, 1, h, d));
            }
    }
  }
}

TEST_P(KvCacheTest, BadCallsAreRejectedAndChangeNothing) {
  make(small_config());
  const std::vector<TokenId> a = iota_tokens(6, 1);
  ASSERT_OK(cache_->add_sequence(1, a));
  append(1, a, 0);
  const ControlStats before = cache_->stats();
  DeviceBuffer k(*backend_, 3 * 64 * 2), v(*backend_, 3 * 64 * 2);
  EXPECT_EQ(cache_->write_kv(1, 0, k.data(), v.data(), DType::kFloat16).code(),
            StatusCode::kFailedPrecondition);  // nothing reserved
  EXPECT_EQ(cache_->write_kv(9, 0, k.data(), v.data(), DType::kFloat16).code(),
            StatusCode::kNotFound);
  ASSERT_OK(cache_->reserve(1, 1));
  EXPECT_EQ(cache_->write_kv(1, 2, k.data(), v.data(), DType::kFloat16).code(),
            StatusCode::kOutOfRange);  // layer 2 of 2
  EXPECT_EQ(
      cache_
          ->gather_layer(1, 0, k.data(), v.data(), DType::kFloat16, PackedLayout::kHeadMajor, 4, 5)
          .code(),
      StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->add_sequence(1, a).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cache_->restore(1).code(), StatusCode::kFailedPrecondition);
  const ControlStats after = cache_->stats();
  EXPECT_EQ(before.device.used_blocks, after.device.used_blocks);
  EXPECT_EQ(before.sequences, after.sequences);
  ASSERT_OK(cache_->rollback(1, 6));
  expect_contents(1, a);
  ASSERT_OK(cache_->check_invariants());
}

}  // namespace
}  // namespace pagedkv
