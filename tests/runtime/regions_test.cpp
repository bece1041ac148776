// KvCache::regions() and block_geometry(), and pair_block_runs (regions.hpp): the addresses a
// transfer engine gets are the pool's own (checked against layout.hpp's arithmetic and against
// gather_layer), and a prompt copied block by block between two caches through them, as a
// peer's READ would, decodes on the other side as a prefix the second cache computed itself.
#include "pagedkv/regions.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/layout.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/model_cache_harness.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

CacheConfig small_config(DType dtype, PageLayout layout, int64_t host_blocks) {
  CacheConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 12;
  c.block_size = 4;
  c.num_device_blocks = 37;
  c.num_host_blocks = host_blocks;
  c.dtype = dtype;
  c.page_layout = layout;
  c.backend = BackendKind::kCpu;
  return c;
}

std::unique_ptr<KvCache> make_cache(const CacheConfig& config) {
  auto c = KvCache::create(config);
  EXPECT_OK(c);
  return c.ok() ? std::move(c).value() : nullptr;
}

std::vector<TokenId> tokens_from(TokenId first, int64_t n) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<TokenId>(i);
  return t;
}

// Adds `id` with `tokens` and writes and commits the model's K/V of all of them.
void prefill(KvCache& kv, SequenceId id, const std::vector<TokenId>& tokens) {
  const CacheConfig& config = kv.config();
  ASSERT_OK(kv.add_sequence(id, tokens));
  ASSERT_OK(kv.reserve(id, static_cast<int64_t>(tokens.size())));
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const std::vector<uint16_t> k = model_rows(config, layer, 0, tokens, 0);
    const std::vector<uint16_t> v = model_rows(config, layer, 1, tokens, 0);
    DeviceBuffer dk(kv.backend(), k.size() * 2), dv(kv.backend(), v.size() * 2);
    dk.upload(k);
    dv.upload(v);
    ASSERT_OK(kv.write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16));
    ASSERT_OK(kv.synchronize());
  }
  ASSERT_OK(kv.commit(id, tokens));
  ASSERT_OK(kv.check_invariants());
}

// Every element of `id`'s K/V, gathered as fp16, equals the model's.
void expect_model_contents(KvCache& kv, SequenceId id, const std::vector<TokenId>& tokens) {
  const CacheConfig& config = kv.config();
  const auto n = static_cast<int64_t>(tokens.size());
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const auto elems = static_cast<size_t>(n * config.num_kv_heads * config.head_dim);
    DeviceBuffer k(kv.backend(), elems * 2), v(kv.backend(), elems * 2);
    ASSERT_OK(
        kv.gather_layer(id, layer, k.data(), v.data(), DType::kFloat16, PackedLayout::kTokenMajor));
    ASSERT_OK(kv.synchronize());
    const std::vector<uint16_t> gk = k.download<uint16_t>(), gv = v.download<uint16_t>();
    for (int64_t t = 0; t < n; ++t)
      for (int32_t h = 0; h < config.num_kv_heads; ++h)
        for (int32_t e = 0; e < config.head_dim; ++e) {
          const auto i = static_cast<size_t>((t * config.num_kv_heads + h) * config.head_dim + e);
          const TokenId tok = tokens[static_cast<size_t>(t)];
          ASSERT_EQ(gk[i], kv_value(t, tok, layer, 0, h, e)) << "seq " << id << " pos " << t;
          ASSERT_EQ(gv[i], kv_value(t, tok, layer, 1, h, e)) << "seq " << id << " pos " << t;
        }
  }
}

// Every layer's K then V of `id`, gathered as fp32: what an attention kernel would read.
std::vector<float> gather_all(KvCache& kv, SequenceId id, int64_t n) {
  const CacheConfig& config = kv.config();
  std::vector<float> all;
  for (int32_t layer = 0; layer < config.num_layers; ++layer) {
    const auto elems = static_cast<size_t>(n * config.num_kv_heads * config.head_dim);
    DeviceBuffer k(kv.backend(), elems * 4), v(kv.backend(), elems * 4);
    EXPECT_OK(
        kv.gather_layer(id, layer, k.data(), v.data(), DType::kFloat32, PackedLayout::kTokenMajor));
    EXPECT_OK(kv.synchronize());
    for (DeviceBuffer* b : {&k, &v}) {
      const std::vector<float> part = b->download<float>();
      all.insert(all.end(), part.begin(), part.end());
    }
  }
  return all;
}

std::vector<int32_t> device_blocks(const KvCache& kv, SequenceId id) {
  auto locs = kv.block_locations(id);
  EXPECT_OK(locs);
  std::vector<int32_t> ids;
  if (!locs.ok()) return ids;
  for (const BlockLocation& l : *locs) {
    EXPECT_EQ(l.tier, Tier::kDevice);
    ids.push_back(l.block);
  }
  return ids;
}

TEST(Regions, ListEveryPoolOfEveryGroup) {
  const CacheConfig config = small_config(DType::kFloat16, PageLayout::kNHD, 11);
  std::unique_ptr<KvCache> kv = make_cache(config);
  ASSERT_NE(kv, nullptr);
  const std::vector<PoolRegion> regions = kv->regions();
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0].tier, Tier::kDevice);
  EXPECT_EQ(regions[0].base, reinterpret_cast<uintptr_t>(kv->device_pool().data));
  EXPECT_EQ(regions[0].bytes, config.block_bytes() * 37);
  EXPECT_EQ(regions[0].memory, MemoryKind::kHost) << "the CPU backend's device pool is DRAM";
  EXPECT_STREQ(memory_kind_name(regions[0].memory), "DRAM");
  EXPECT_STREQ(memory_kind_name(MemoryKind::kDevice), "VRAM");
  EXPECT_EQ(regions[1].tier, Tier::kHost);
  EXPECT_EQ(regions[1].bytes, config.block_bytes() * 11);
  EXPECT_NE(regions[1].base, 0u);

  std::unique_ptr<KvCache> no_host = make_cache(small_config(DType::kFloat16, PageLayout::kNHD, 0));
  ASSERT_NE(no_host, nullptr);
  EXPECT_EQ(no_host->regions().size(), 1u);

  // A model with a full and a window group: a device pool for each.
  CacheConfig two = testing::two_groups(24, 10);
  two.backend = BackendKind::kCpu;
  std::unique_ptr<KvCache> model = make_cache(two);
  ASSERT_NE(model, nullptr);
  const std::vector<PoolRegion> both = model->regions();
  ASSERT_EQ(both.size(), static_cast<size_t>(model->num_groups()));
  for (int32_t g = 0; g < model->num_groups(); ++g) {
    EXPECT_EQ(both[static_cast<size_t>(g)].group, g);
    EXPECT_EQ(both[static_cast<size_t>(g)].base,
              reinterpret_cast<uintptr_t>(model->device_pool(g).data));
    EXPECT_EQ(both[static_cast<size_t>(g)].bytes,
              model->group_config(g).block_bytes() * model->group_config(g).num_device_blocks);
  }
}

// The geometry's arithmetic against layout.hpp's: for every block, layer and part, the address
// a peer computes is the one the pool's own offset function gives.
TEST(Regions, GeometryAddressesMatchThePoolLayout) {
  for (DType dtype : {DType::kFloat16, DType::kFloat32}) {
    for (PageLayout layout : {PageLayout::kNHD, PageLayout::kHND}) {
      const CacheConfig config = small_config(dtype, layout, 5);
      std::unique_ptr<KvCache> kv = make_cache(config);
      ASSERT_NE(kv, nullptr);
      for (Tier tier : {Tier::kDevice, Tier::kHost}) {
        auto geo = kv->block_geometry(0, tier, "m");
        ASSERT_OK(geo);
        const PoolLayout pl = PoolLayout::from_config(config);
        const auto elem = static_cast<int64_t>(dtype_size(dtype));
        EXPECT_EQ(geo->num_blocks, tier == Tier::kDevice ? 37 : 5);
        EXPECT_EQ(geo->block_bytes, config.block_bytes());
        EXPECT_EQ(geo->layer_bytes * config.num_layers, geo->block_bytes);
        ASSERT_EQ(geo->layer_base.size(), 3u);
        EXPECT_EQ(geo->dtype, dtype);
        EXPECT_EQ(geo->page_layout, layout);
        for (int64_t b = 0; b < geo->num_blocks; ++b)
          for (int32_t l = 0; l < config.num_layers; ++l)
            for (int32_t part = 0; part < 2; ++part) {
              const uintptr_t peer = geo->layer_base[static_cast<size_t>(l)] +
                                     static_cast<uintptr_t>(b * geo->block_bytes) +
                                     static_cast<uintptr_t>(part * config.page_bytes());
              const int64_t off = pl.page_offset(b, l, static_cast<KvPart>(part));
              ASSERT_EQ(peer, geo->region.base + static_cast<uintptr_t>(off * elem))
                  << "block " << b << " layer " << l << " part " << part;
            }
      }
    }
  }
}

TEST(Regions, TheFingerprintNamesTheLayoutAndTheModel) {
  std::unique_ptr<KvCache> a = make_cache(small_config(DType::kFloat16, PageLayout::kNHD, 0));
  std::unique_ptr<KvCache> b = make_cache(small_config(DType::kFloat16, PageLayout::kNHD, 0));
  std::unique_ptr<KvCache> hnd = make_cache(small_config(DType::kFloat16, PageLayout::kHND, 0));
  std::unique_ptr<KvCache> fp32 = make_cache(small_config(DType::kFloat32, PageLayout::kNHD, 0));
  ASSERT_TRUE(a && b && hnd && fp32);
  const BlockGeometry ga = *a->block_geometry(0, Tier::kDevice, "llama");
  EXPECT_OK(check_same_block_layout(ga, *b->block_geometry(0, Tier::kDevice, "llama")));
  for (const BlockGeometry& other : {*b->block_geometry(0, Tier::kDevice, "mistral"),
                                     *hnd->block_geometry(0, Tier::kDevice, "llama"),
                                     *fp32->block_geometry(0, Tier::kDevice, "llama")}) {
    const Status s = check_same_block_layout(ga, other);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_NE(s.message().find("fingerprint"), std::string::npos) << s.message();
    EXPECT_EQ(pair_block_runs(ga, {0}, other, {0}).status().code(),
              StatusCode::kFailedPrecondition);
  }
}

TEST(Regions, BadRequestsAreRefusedWithTheirReason) {
  std::unique_ptr<KvCache> kv = make_cache(small_config(DType::kFloat16, PageLayout::kNHD, 0));
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->block_geometry(1, Tier::kDevice).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(kv->block_geometry(-1, Tier::kDevice).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(kv->block_geometry(0, Tier::kStorage).status().code(), StatusCode::kInvalidArgument);
  const Status no_host = kv->block_geometry(0, Tier::kHost).status();
  EXPECT_EQ(no_host.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(no_host.message().find("num_host_blocks"), std::string::npos) << no_host.message();

  const BlockGeometry g = *kv->block_geometry(0, Tier::kDevice);
  const auto sizes = pair_block_runs(g, {1, 2}, g, {3});
  EXPECT_EQ(sizes.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sizes.status().message().find("src_ids has 2"), std::string::npos);
  for (int32_t bad : {-1, 37, 1 << 30}) {
    const auto s = pair_block_runs(g, {0, bad}, g, {1, 2});
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("src_ids[1]"), std::string::npos) << s.status().message();
    const auto d = pair_block_runs(g, {0, 1}, g, {bad, 2});
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("dst_ids[0]"), std::string::npos) << d.status().message();
  }
  auto none = pair_block_runs(g, {}, g, {});
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

// Random id lists against the plain reading of the contract: the runs, expanded block by block,
// are exactly the pairs given, in order, and no two neighbouring runs could have been one.
TEST(Regions, RunsMergeExactlyWhereBothSidesGoOnByOne) {
  std::unique_ptr<KvCache> kv = make_cache(small_config(DType::kFloat16, PageLayout::kNHD, 0));
  ASSERT_NE(kv, nullptr);
  const BlockGeometry g = *kv->block_geometry(0, Tier::kDevice);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = static_cast<int>(rng() % 20);
    std::vector<int32_t> src, dst;
    int32_t s = static_cast<int32_t>(rng() % 37), d = static_cast<int32_t>(rng() % 37);
    for (int i = 0; i < n; ++i) {
      // Mostly runs on, sometimes jumps on one side or both.
      const uint32_t r = rng() % 6;
      s = r == 0 || r == 2 ? static_cast<int32_t>(rng() % 37) : (s + 1) % 37;
      d = r == 1 || r == 2 ? static_cast<int32_t>(rng() % 37) : (d + 1) % 37;
      src.push_back(s);
      dst.push_back(d);
    }
    auto runs = pair_block_runs(g, src, g, dst);
    ASSERT_OK(runs);
    std::vector<int32_t> src_back, dst_back;
    for (size_t r = 0; r < runs->size(); ++r) {
      const BlockRun& run = (*runs)[r];
      ASSERT_GE(run.blocks, 1);
      EXPECT_EQ(run.src, g.region.base + static_cast<uintptr_t>(run.src_block * g.block_bytes));
      EXPECT_EQ(run.dst, g.region.base + static_cast<uintptr_t>(run.dst_block * g.block_bytes));
      EXPECT_EQ(run.bytes, run.blocks * g.block_bytes);
      for (int64_t i = 0; i < run.blocks; ++i) {
        src_back.push_back(static_cast<int32_t>(run.src_block + i));
        dst_back.push_back(static_cast<int32_t>(run.dst_block + i));
      }
      if (r > 0) {
        const BlockRun& prev = (*runs)[r - 1];
        EXPECT_FALSE(run.src_block == prev.src_block + prev.blocks &&
                     run.dst_block == prev.dst_block + prev.blocks)
            << "runs " << r - 1 << " and " << r << " could be one";
      }
    }
    EXPECT_EQ(src_back, src);
    EXPECT_EQ(dst_back, dst);
  }
}

// Prefill in one cache, decode in another: the decode side reserves blocks for the prompt, a
// copy of the prefill side's blocks arrives through the geometries (memcpy standing for a
// peer's READ), commit declares the tokens computed. The decode side then reads what the
// prefill side reads, and a later request with the same prompt hits it in the prefix cache.
TEST(Regions, APromptMovesToAnotherCacheThroughItsBlocks) {
  for (DType dtype : {DType::kFloat16, DType::kFloat32, DType::kBFloat16}) {
    for (PageLayout layout : {PageLayout::kNHD, PageLayout::kHND}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (layout == PageLayout::kNHD ? " NHD" : " HND"));
      const CacheConfig config = small_config(dtype, layout, 0);
      std::unique_ptr<KvCache> prefill_side = make_cache(config);
      std::unique_ptr<KvCache> decode_side = make_cache(config);
      ASSERT_TRUE(prefill_side && decode_side);
      const std::vector<TokenId> prompt = tokens_from(100, 23);  // 5 full blocks and 3 tokens
      // Scatter the free blocks on both sides, so the ids do not run in step.
      prefill(*prefill_side, 1, tokens_from(5000, 9));
      prefill(*decode_side, 1, tokens_from(6000, 17));
      prefill(*decode_side, 2, tokens_from(7000, 2));
      ASSERT_OK(decode_side->erase(1));
      prefill(*prefill_side, 7, prompt);

      ASSERT_OK(decode_side->add_sequence(9, prompt));
      ASSERT_OK(decode_side->reserve(9, static_cast<int64_t>(prompt.size())));
      ASSERT_OK(decode_side->synchronize());
      const std::vector<int32_t> src = device_blocks(*prefill_side, 7);
      const std::vector<int32_t> dst = device_blocks(*decode_side, 9);
      ASSERT_EQ(src.size(), 6u);
      ASSERT_EQ(dst.size(), 6u);
      auto runs = pair_block_runs(*prefill_side->block_geometry(0, Tier::kDevice, "m"), src,
                                  *decode_side->block_geometry(0, Tier::kDevice, "m"), dst);
      ASSERT_OK(runs);
      EXPECT_LT(runs->size(), src.size()) << "some blocks run on on both sides";
      for (const BlockRun& r : *runs) {
        std::memcpy(reinterpret_cast<void*>(r.dst), reinterpret_cast<const void*>(r.src),
                    static_cast<size_t>(r.bytes));
      }
      ASSERT_OK(decode_side->commit(9, prompt));
      ASSERT_OK(decode_side->check_invariants());
      const auto n = static_cast<int64_t>(prompt.size());
      EXPECT_EQ(gather_all(*decode_side, 9, n), gather_all(*prefill_side, 7, n));
      if (dtype != DType::kBFloat16) {  // the model's fp16 values survive fp16 and fp32 pools
        expect_model_contents(*decode_side, 9, prompt);
        expect_model_contents(*decode_side, 2, tokens_from(7000, 2));  // its neighbour untouched
      }

      // The moved prompt is the decode side's prefix now.
      auto hit = decode_side->add_sequence(10, prompt);
      ASSERT_OK(hit);
      EXPECT_EQ(*hit, 20) << "the 5 full blocks that arrived are cached";
      ASSERT_OK(decode_side->check_invariants());
    }
  }
}

}  // namespace
}  // namespace pagedkv
