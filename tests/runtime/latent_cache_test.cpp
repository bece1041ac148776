// KvCache over a latent (MLA) pool, end to end on real bytes: keys only, one page per layer.
// Reserve / write / commit, gather, the batched step calls, fork with copy-on-write, offload and
// restore all read back bit-exact, with check_invariants() after every step; the device view
// reads the latent (and its kpe slice) of each token; bad calls (a value tensor, a malformed
// latent config) fail with a clear error and change nothing. On both backends
// (runtime_backends.hpp) except where a test reads device memory from the host.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/seed_cache.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

// Odd latent width: 32 ckv + 5 kpe elements.
CacheConfig latent_config() {
  CacheConfig c;
  c.kv_kind = KvKind::kLatent;
  c.num_layers = 3;
  c.num_kv_heads = 1;
  c.head_dim = 37;
  c.rope_dim = 5;
  c.block_size = 4;
  c.num_device_blocks = 12;
  c.num_host_blocks = 12;
  c.dtype = DType::kFloat16;
  return c;
}

// DeepSeek V2/V3's latent: 512 ckv + 64 kpe.
CacheConfig deepseek_config() {
  CacheConfig c = latent_config();
  c.num_layers = 2;
  c.head_dim = 576;
  c.rope_dim = 64;
  c.block_size = 16;
  c.num_device_blocks = 6;
  c.num_host_blocks = 6;
  return c;
}

std::vector<TokenId> iota_tokens(int n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

#define EXPECT_INVARIANTS() EXPECT_OK(cache_->check_invariants())

class LatentCacheTest : public testing::BackendParamTest {
 protected:
  void make(CacheConfig config) {
    config.backend = kind();
    config_ = config;
    cache_.reset();  // before the backend it runs on
    backend_ = testing::make_backend(kind());
    ASSERT_NE(backend_, nullptr);
    KvCacheOptions o;
    o.backend = backend_.get();
    auto c = KvCache::create(config, o);
    ASSERT_OK(c);
    cache_ = std::move(c).value();
    EXPECT_INVARIANTS();
  }

  // Reserves, writes every layer's latents (value null) and commits `tokens` at positions start..
  void append(SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    auto slots = cache_->reserve(id, static_cast<int64_t>(tokens.size()));
    ASSERT_OK(slots);
    EXPECT_INVARIANTS();
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<uint16_t> latent = model_rows(config_, layer, 0, tokens, start);
      DeviceBuffer d(*backend_, latent.size() * 2);
      d.upload(latent);
      const Status s = cache_->write_kv(id, layer, d.data(), nullptr, DType::kFloat16);
      ASSERT_OK(s);
      ASSERT_OK(cache_->synchronize());  // the staging buffer goes out of scope
      EXPECT_INVARIANTS();
    }
    ASSERT_OK(cache_->commit(id, tokens));
    EXPECT_INVARIANTS();
  }

  // Gathers every layer of `id` (no value buffer) and compares every element with the model.
  void expect_contents(SequenceId id, const std::vector<TokenId>& tokens,
                       PackedLayout packed = PackedLayout::kTokenMajor) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int32_t dim = config_.head_dim;
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const size_t elems = static_cast<size_t>(n * dim);
      DeviceBuffer out(*backend_, (elems + 3) * 2);
      const std::vector<uint16_t> poison(elems + 3, 0xBEEF);
      out.upload(poison);
      const Status s =
          cache_->gather_layer(id, layer, out.data(), nullptr, DType::kFloat16, packed);
      ASSERT_OK(s);
      ASSERT_OK(cache_->synchronize());
      const std::vector<uint16_t> got = out.download<uint16_t>();
      for (int64_t t = 0; t < n; ++t)
        for (int32_t d = 0; d < dim; ++d)
          ASSERT_EQ(got[static_cast<size_t>(t * dim + d)],
                    kv_value(t, tokens[static_cast<size_t>(t)], layer, 0, 0, d))
              << "seq " << id << " layer " << layer << " pos " << t << " dim " << d;
      for (size_t i = elems; i < elems + 3; ++i) ASSERT_EQ(got[i], 0xBEEF) << "wrote past the end";
      EXPECT_INVARIANTS();
    }
  }

  // The whole device pool's bytes.
  std::vector<uint8_t> pool_bytes() {
    const PoolRef pool = cache_->device_pool();
    std::vector<uint8_t> out(static_cast<size_t>(pool.layout.block_elems() * pool.num_blocks * 2));
    EXPECT_OK(cache_->synchronize());
    EXPECT_OK(
        backend_->copy_async(out.data(), pool.data, out.size(), CopyKind::kDeviceToHost, Stream{}));
    EXPECT_OK(backend_->synchronize_stream(Stream{}));
    return out;
  }

  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> cache_;
};
INSTANTIATE_TEST_SUITE_P(Backends, LatentCacheTest, testing::runtime_backends(),
                         testing::backend_param_name);

TEST_P(LatentCacheTest, CreateAllocatesOnePagePerLayer) {
  make(latent_config());
  const int64_t block = int64_t{3} * 4 * 37 * 2;  // layers * block_size * latent * fp16
  EXPECT_EQ(config_.block_bytes(), block);
  EXPECT_EQ(cache_->pool_info().device_bytes, block * 12);
  EXPECT_EQ(cache_->pool_info().host_bytes, block * 12);
  const PoolRef pool = cache_->device_pool();
  EXPECT_EQ(pool.layout.num_parts, 1);
  EXPECT_EQ(pool.layout.rope_dim, 5);
  EXPECT_EQ(pool.layout.block_elems() * 2, block);
}

TEST_P(LatentCacheTest, WriteCommitGatherRoundTrip) {
  for (const CacheConfig& config : {latent_config(), deepseek_config()}) {
    SCOPED_TRACE("head_dim " + std::to_string(config.head_dim));
    make(config);
    const std::vector<TokenId> prompt = iota_tokens(10, 100);
    ASSERT_EQ(*cache_->add_sequence(1, prompt), 0);
    EXPECT_INVARIANTS();
    append(1, prompt, 0);
    expect_contents(1, prompt);
    std::vector<TokenId> all = prompt;
    for (int step = 0; step < 5; ++step) {  // decode: one token at a time
      const TokenId next = 500 + step;
      append(1, {next}, static_cast<int64_t>(all.size()));
      all.push_back(next);
    }
    expect_contents(1, all, PackedLayout::kTokenMajor);
    expect_contents(1, all, PackedLayout::kHeadMajor);  // one head: the same [len, dim]
  }
}

TEST_P(LatentCacheTest, PrefixReuseAndForkCopyOnWriteKeepEverySequenceExact) {
  make(latent_config());
  const std::vector<TokenId> prompt = iota_tokens(9, 10);  // two full blocks and one token
  ASSERT_OK(cache_->add_sequence(1, prompt));
  append(1, prompt, 0);
  ASSERT_OK(cache_->fork(1, 2));
  EXPECT_INVARIANTS();
  append(2, {77, 78}, 9);  // writes into the shared partial block: copied first
  std::vector<TokenId> child = prompt;
  child.push_back(77);
  child.push_back(78);
  expect_contents(1, prompt);
  expect_contents(2, child);
  ASSERT_OK(cache_->finish(1));
  EXPECT_INVARIANTS();
  // A new prompt with the same first 8 tokens hits both full blocks.
  std::vector<TokenId> again = iota_tokens(8, 10);
  again.push_back(999);
  EXPECT_EQ(*cache_->add_sequence(3, again), 8);
  EXPECT_INVARIANTS();
  append(3, {999}, 8);
  expect_contents(3, again);
}

TEST_P(LatentCacheTest, OffloadReuseRestoreReadsBackExactly) {
  CacheConfig c = latent_config();
  c.num_device_blocks = 4;  // room for one 12-token sequence at a time
  make(c);
  const std::vector<TokenId> a = iota_tokens(12, 1000), b = iota_tokens(12, 2000);
  ASSERT_OK(cache_->add_sequence(1, a));
  append(1, a, 0);
  ASSERT_OK(cache_->offload(1));
  EXPECT_INVARIANTS();
  ASSERT_OK(cache_->add_sequence(2, b));
  append(2, b, 0);                // takes the device blocks A left
  ASSERT_OK(cache_->restore(1));  // offloads B to make room
  EXPECT_INVARIANTS();
  expect_contents(1, a);
  ASSERT_OK(cache_->restore(2));
  EXPECT_INVARIANTS();
  expect_contents(2, b);
  EXPECT_EQ(cache_->stats().sequences_offloaded, 3);
  EXPECT_EQ(cache_->stats().sequences_restored, 2);
}

TEST_P(LatentCacheTest, BatchedWritesTakeNullValues) {
  make(latent_config());
  const std::vector<SequenceId> ids = {1, 2};
  const std::vector<TokenId> p1 = iota_tokens(5, 100), p2 = iota_tokens(3, 200);
  ASSERT_OK(cache_->add_sequence(1, p1));
  ASSERT_OK(cache_->add_sequence(2, p2));
  append(1, p1, 0);
  append(2, p2, 0);
  std::vector<TokenId> all1 = p1, all2 = p2;
  for (int step = 0; step < 4; ++step) {
    const bool all_layers = step % 2 == 1;
    ASSERT_OK(cache_->reserve_batch(ids, 1));
    EXPECT_INVARIANTS();
    auto batch = cache_->build_batch(ids);
    ASSERT_OK(batch);
    const TokenId t1 = 300 + step, t2 = 400 + step;
    const int64_t row = config_.head_dim;
    // [num_layers][2 tokens, 1, dim]: token 0 is sequence 1's, token 1 sequence 2's.
    std::vector<uint16_t> in(static_cast<size_t>(config_.num_layers * 2 * row));
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const auto r1 = model_rows(config_, l, 0, {t1}, static_cast<int64_t>(all1.size()));
      const auto r2 = model_rows(config_, l, 0, {t2}, static_cast<int64_t>(all2.size()));
      std::copy(r1.begin(), r1.end(), in.begin() + (l * 2) * row);
      std::copy(r2.begin(), r2.end(), in.begin() + (l * 2 + 1) * row);
    }
    DeviceBuffer d(*backend_, in.size() * 2);
    d.upload(in);
    if (all_layers) {
      const Status s =
          cache_->write_kv_batch_all_layers(*batch, d.data(), nullptr, DType::kFloat16);
      ASSERT_OK(s);
    } else {
      for (int32_t l = 0; l < config_.num_layers; ++l) {
        const Status s =
            cache_->write_kv_batch(*batch, l, static_cast<const uint16_t*>(d.data()) + l * 2 * row,
                                   nullptr, DType::kFloat16);
        ASSERT_OK(s);
      }
    }
    ASSERT_OK(cache_->synchronize());
    EXPECT_INVARIANTS();
    ASSERT_OK(cache_->commit_batch(ids, {t1, t2}));
    EXPECT_INVARIANTS();
    all1.push_back(t1);
    all2.push_back(t2);
  }
  expect_contents(1, all1);
  expect_contents(2, all2);
}

TEST_P(LatentCacheTest, ValueTensorIsRefusedAndChangesNothing) {
  make(latent_config());
  const std::vector<TokenId> prompt = iota_tokens(6, 100);
  ASSERT_OK(cache_->add_sequence(1, prompt));
  append(1, prompt, 0);
  ASSERT_OK(cache_->reserve(1, 2));
  const std::vector<uint8_t> before = pool_bytes();
  const std::vector<uint16_t> in(static_cast<size_t>(2 * config_.head_dim * config_.num_layers),
                                 0x3C00);
  DeviceBuffer d(*backend_, in.size() * 2);
  d.upload(in);
  const std::string kWant = "value: a latent (MLA) cache stores no values; pass null";
  const auto expect_refused = [&](const Status& s, const char* call) {
    SCOPED_TRACE(call);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), kWant);
    EXPECT_EQ(pool_bytes(), before);
    EXPECT_INVARIANTS();
  };
  expect_refused(cache_->write_kv(1, 0, d.data(), d.data(), DType::kFloat16), "write_kv");
  auto batch = cache_->build_batch({1});
  ASSERT_OK(batch);
  expect_refused(cache_->write_kv_batch(*batch, 0, d.data(), d.data(), DType::kFloat16),
                 "write_kv_batch");
  expect_refused(cache_->write_kv_batch_all_layers(*batch, d.data(), d.data(), DType::kFloat16),
                 "write_kv_batch_all_layers");
  DeviceBuffer out(*backend_, in.size() * 8);
  expect_refused(
      cache_->gather_layer(1, 0, out.data(), out.data(), DType::kFloat16, PackedLayout::kHeadMajor),
      "gather_layer");
  EXPECT_EQ(*cache_->pending(1), 2);
  EXPECT_EQ(*cache_->length(1), 6);
  // Nothing was taken: the reserved tokens can still be written and committed.
  std::vector<TokenId> more = {7, 8};
  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const auto rows = model_rows(config_, layer, 0, more, 6);
    DeviceBuffer dl(*backend_, rows.size() * 2);
    dl.upload(rows);
    ASSERT_OK(cache_->write_kv(1, layer, dl.data(), nullptr, DType::kFloat16));
    ASSERT_OK(cache_->synchronize());
  }
  ASSERT_OK(cache_->commit(1, more));
  EXPECT_INVARIANTS();
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  expect_contents(1, all);
}

TEST_P(LatentCacheTest, KeyValueCacheStillNeedsItsValues) {
  CacheConfig c = latent_config();
  c.kv_kind = KvKind::kKeyValue;
  c.rope_dim = 0;
  make(c);
  ASSERT_OK(cache_->add_sequence(1, iota_tokens(3, 1)));
  ASSERT_OK(cache_->reserve(1, 3));
  DeviceBuffer d(*backend_, 3 * 37 * 2);
  const Status s = cache_->write_kv(1, 0, d.data(), nullptr, DType::kFloat16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("value: ", 0), 0u) << s.message();
  EXPECT_INVARIANTS();
}

TEST(LatentCacheConfigTest, MalformedLatentConfigsAreRefusedByName) {
  const auto expect_field = [](const CacheConfig& c, const std::string& field) {
    auto cache = KvCache::create(c);
    ASSERT_FALSE(cache.ok());
    EXPECT_EQ(cache.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.status().message().rfind(field + ": ", 0), 0u) << cache.status().message();
  };
  CacheConfig c = latent_config();
  c.backend = BackendKind::kCpu;
  CacheConfig bad = c;
  bad.num_kv_heads = 2;
  expect_field(bad, "num_kv_heads");
  bad = c;
  bad.rope_dim = 0;
  expect_field(bad, "rope_dim");
  bad.rope_dim = c.head_dim;
  expect_field(bad, "rope_dim");
  bad = c;
  bad.kv_kind = KvKind::kKeyValue;  // a K/V cache has no rope part
  expect_field(bad, "rope_dim");
  // The seed-compatible cache stores keys and values only.
  auto seed = SeedKvCache::create(c);
  ASSERT_FALSE(seed.ok());
  EXPECT_EQ(seed.status().message().rfind("kv_kind: ", 0), 0u) << seed.status().message();
}

// The device view of a built batch reads each token's latent and its kpe slice (CPU backend:
// the test reads device memory from the host).
TEST(LatentCacheViewTest, DeviceViewReadsLatentsAndKpeSlices) {
  CacheConfig c = latent_config();
  c.backend = BackendKind::kCpu;
  auto made = KvCache::create(c);
  ASSERT_OK(made);
  KvCache& kv = **made;
  const std::vector<TokenId> tokens = iota_tokens(7, 40);
  ASSERT_OK(kv.add_sequence(1, tokens));
  ASSERT_OK(kv.reserve(1, 7));
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    const auto rows = model_rows(c, layer, 0, tokens, 0);
    ASSERT_OK(kv.write_kv(1, layer, rows.data(), nullptr, DType::kFloat16));
    ASSERT_OK(kv.synchronize());
  }
  ASSERT_OK(kv.commit(1, tokens));
  BatchOptions o;
  o.build_csr = true;
  auto batch = kv.build_batch({1}, o);
  ASSERT_OK(batch);
  ASSERT_OK(kv.synchronize());
  const device::PagedKvView view = kv.device_view(*batch);
  ASSERT_TRUE(view.layout.is_latent());
  ASSERT_EQ(view.seq_len(0), 7);
  const int32_t ckv = c.head_dim - c.rope_dim;
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    const device::FlashInferMlaPagedArgs a = device::flashinfer_mla_args(view, layer);
    for (int64_t pos = 0; pos < 7; ++pos) {
      const int32_t page = batch->indices[pos / c.block_size];
      const int64_t n = pos % c.block_size;
      const auto* ckv_row =
          static_cast<const uint16_t*>(a.ckv_data) + page * a.stride_page_ckv + n * a.stride_n_ckv;
      const auto* kpe_row =
          static_cast<const uint16_t*>(a.kpe_data) + page * a.stride_page_kpe + n * a.stride_n_kpe;
      const auto* latent = static_cast<const uint16_t*>(view.latent_address(0, layer, pos));
      for (int32_t d = 0; d < ckv; ++d) {
        ASSERT_EQ(ckv_row[d], kv_value(pos, tokens[size_t(pos)], layer, 0, 0, d));
        ASSERT_EQ(latent[d], ckv_row[d]);
      }
      for (int32_t d = 0; d < c.rope_dim; ++d) {
        ASSERT_EQ(kpe_row[d], kv_value(pos, tokens[size_t(pos)], layer, 0, 0, ckv + d));
        ASSERT_EQ(static_cast<const uint16_t*>(view.kpe_address(0, layer, pos))[d], kpe_row[d]);
      }
    }
  }
  EXPECT_OK(kv.check_invariants());
}

}  // namespace
}  // namespace pagedkv
