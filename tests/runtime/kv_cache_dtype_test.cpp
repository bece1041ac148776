// Device -> host -> device round trips of a KvCache are bit-exact for every pool dtype: the
// bytes gathered after offload and restore equal those gathered before. On both backends
// (runtime_backends.hpp; the copy delay is the CPU backend's).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;

class KvCacheDtypeTest : public ::testing::TestWithParam<std::tuple<DType, BackendKind>> {
 protected:
  void SetUp() override { testing::require_backend(std::get<1>(GetParam())); }
};

TEST_P(KvCacheDtypeTest, OffloadRestoreRoundTripIsBitExact) {
  const DType dtype = std::get<0>(GetParam());
  const BackendKind kind = std::get<1>(GetParam());
  CacheConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 80;
  c.block_size = 8;
  c.num_device_blocks = 8;
  c.num_host_blocks = 8;
  c.dtype = dtype;
  c.backend = kind;
  CpuBackendOptions slow;
  slow.copy_delay = std::chrono::milliseconds(5);
  auto backend = testing::make_backend(kind, slow);
  ASSERT_NE(backend, nullptr);
  KvCacheOptions o;
  o.backend = backend.get();
  auto created = KvCache::create(c, o);
  ASSERT_OK(created);
  KvCache& cache = **created;

  // fp8 pools are written unscaled: keep the inputs inside e4m3's range.
  const int64_t n = 21;
  const size_t elems = static_cast<size_t>(n * c.num_kv_heads * c.head_dim);
  std::mt19937 rng(static_cast<uint32_t>(dtype) + 7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<TokenId>(i * 3 + 1);
  ASSERT_OK(cache.add_sequence(1, tokens));
  ASSERT_OK(cache.reserve(1, n));
  DeviceBuffer k(*backend, elems * 4), v(*backend, elems * 4);
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    std::vector<float> hk(elems), hv(elems);
    for (size_t i = 0; i < elems; ++i) {
      hk[i] = dist(rng);
      hv[i] = dist(rng);
      if (hk[i] == 0.0f) hk[i] = 1.0f;
    }
    k.upload(hk);
    v.upload(hv);
    ASSERT_OK(cache.write_kv(1, layer, k.data(), v.data(), DType::kFloat32));
    ASSERT_OK(cache.synchronize());
  }
  ASSERT_OK(cache.commit(1, tokens));

  auto gather_all = [&]() {
    std::vector<std::vector<uint8_t>> out;
    const size_t bytes = elems * dtype_size(dtype);
    DeviceBuffer gk(*backend, bytes), gv(*backend, bytes);
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      EXPECT_OK(
          cache.gather_layer(1, layer, gk.data(), gv.data(), dtype, PackedLayout::kHeadMajor));
      EXPECT_OK(cache.synchronize());
      out.push_back(gk.download<uint8_t>());
      out.push_back(gv.download<uint8_t>());
    }
    return out;
  };
  const auto before = gather_all();
  ASSERT_OK(cache.offload(1));
  ASSERT_OK(cache.synchronize());
  EXPECT_EQ(*cache.residency(1), SequenceResidency::kHost);
  ASSERT_OK(cache.restore(1));
  const auto after = gather_all();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i], after[i]) << "array " << i;
  // The comparison means something only if the gathered bytes vary.
  EXPECT_GT(std::set<uint8_t>(before[0].begin(), before[0].end()).size(), 16u);
  ASSERT_OK(cache.check_invariants());
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, KvCacheDtypeTest,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16,
                                                              DType::kFloat32, DType::kFloat8E4M3),
                                            testing::runtime_backends()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  testing::backend_label(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace pagedkv
