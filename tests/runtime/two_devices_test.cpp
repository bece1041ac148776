// One cache per device in one process (issue #16): two caches, each on its own CPU backend
// standing for one GPU, keep separate books. Each backend's memory limit plays a device's
// memory: a pool taken on one does not count on the other, and offloads, restores and writes on
// one cache leave the other's bytes, residency and counters alone. (The CUDA backend makes its
// own device current for every call; a two-GPU machine is needed to run that, which no test
// here has.)
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "runtime/kv_model.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

CacheConfig device_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 24;
  c.block_size = 4;
  c.num_device_blocks = 3000;  // 4.6 MB: larger than the headroom below
  c.num_host_blocks = 3000;
  c.backend = BackendKind::kCpu;
  return c;
}

struct Device {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvCache> cache;
};

// A backend whose device memory holds one pool of `config` plus 1 MiB (the cache's upload
// arena and the tests' staging buffers), not two pools.
Device make_device(const CacheConfig& config) {
  Device d;
  CpuBackendOptions o;
  o.device_memory_limit =
      static_cast<size_t>(config.block_bytes() * config.num_device_blocks) + (size_t{1} << 20);
  d.backend = create_cpu_backend(o);
  KvCacheOptions ko;
  ko.backend = d.backend.get();
  auto c = KvCache::create(config, ko);
  EXPECT_OK(c);
  if (c.ok()) d.cache = std::move(c).value();
  return d;
}

void append(Device& d, const CacheConfig& config, SequenceId id, const std::vector<TokenId>& tokens,
            int64_t start) {
  ASSERT_OK(d.cache->reserve(id, static_cast<int64_t>(tokens.size())));
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const std::vector<uint16_t> k = model_rows(config, layer, 0, tokens, start);
    const std::vector<uint16_t> v = model_rows(config, layer, 1, tokens, start);
    DeviceBuffer dk(*d.backend, k.size() * 2), dv(*d.backend, v.size() * 2);
    dk.upload(k);
    dv.upload(v);
    ASSERT_OK(d.cache->write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16));
    ASSERT_OK(d.cache->synchronize());
  }
  ASSERT_OK(d.cache->commit(id, tokens));
  ASSERT_OK(d.cache->check_invariants());
}

void expect_contents(Device& d, const CacheConfig& config, SequenceId id,
                     const std::vector<TokenId>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const size_t elems = static_cast<size_t>(n * config.num_kv_heads * config.head_dim);
    DeviceBuffer k(*d.backend, elems * 2), v(*d.backend, elems * 2);
    ASSERT_OK(d.cache->gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                    PackedLayout::kTokenMajor));
    ASSERT_OK(d.cache->synchronize());
    const std::vector<uint16_t> gk = k.download<uint16_t>(), gv = v.download<uint16_t>();
    for (int64_t t = 0; t < n; ++t)
      for (int32_t h = 0; h < config.num_kv_heads; ++h)
        for (int32_t e = 0; e < config.head_dim; ++e) {
          const size_t i = static_cast<size_t>((t * config.num_kv_heads + h) * config.head_dim + e);
          const TokenId tok = tokens[static_cast<size_t>(t)];
          ASSERT_EQ(gk[i], kv_value(t, tok, layer, 0, h, e)) << "seq " << id << " pos " << t;
          ASSERT_EQ(gv[i], kv_value(t, tok, layer, 1, h, e)) << "seq " << id << " pos " << t;
        }
  }
}

std::vector<TokenId> tokens_from(TokenId first, int n) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

TEST(TwoDevices, EachDeviceHoldsItsOwnPool) {
  const CacheConfig config = device_config();
  Device a = make_device(config);
  Device b = make_device(config);
  ASSERT_NE(a.cache, nullptr);
  ASSERT_NE(b.cache, nullptr) << "a pool on device A must not count against device B";
  // Device A is full: a second cache there is refused, and A's first cache is untouched.
  KvCacheOptions on_a;
  on_a.backend = a.backend.get();
  auto again = KvCache::create(config, on_a);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kResourceExhausted);
  EXPECT_OK(a.cache->check_invariants());
}

TEST(TwoDevices, WorkOnOneCacheLeavesTheOtherAlone) {
  const CacheConfig config = device_config();
  Device a = make_device(config);
  Device b = make_device(config);
  ASSERT_NE(a.cache, nullptr);
  ASSERT_NE(b.cache, nullptr);
  // The same sequence ids on both, with different tokens, interleaved.
  const std::vector<TokenId> ta = tokens_from(100, 14), tb = tokens_from(900, 9);
  ASSERT_OK(a.cache->add_sequence(1, {}));
  ASSERT_OK(b.cache->add_sequence(1, {}));
  ASSERT_OK(a.cache->add_sequence(2, {}));
  append(a, config, 1, {ta.begin(), ta.begin() + 7}, 0);
  append(b, config, 1, tb, 0);
  append(a, config, 1, {ta.begin() + 7, ta.end()}, 7);
  append(a, config, 2, tokens_from(500, 5), 0);
  const ControlStats b_before = b.cache->stats();

  // Offload and restore on A: B's residency, counters and bytes do not move.
  ASSERT_OK(a.cache->offload(1));
  ASSERT_EQ(*a.cache->residency(1) == SequenceResidency::kDevice, false);
  EXPECT_EQ(*b.cache->residency(1), SequenceResidency::kDevice);
  ASSERT_OK(a.cache->restore(1));
  ASSERT_OK(a.cache->synchronize());
  EXPECT_EQ(b.cache->stats().device, b_before.device);
  EXPECT_EQ(b.cache->stats().sequences_offloaded, 0);
  EXPECT_EQ(a.cache->stats().sequences_offloaded, 1);
  EXPECT_FALSE(b.cache->contains(2));

  expect_contents(a, config, 1, ta);
  expect_contents(a, config, 2, tokens_from(500, 5));
  expect_contents(b, config, 1, tb);
  EXPECT_OK(a.cache->check_invariants());
  EXPECT_OK(b.cache->check_invariants());
}

}  // namespace
}  // namespace pagedkv
