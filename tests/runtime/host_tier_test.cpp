// The host tier as a prefix cache, end to end on real bytes (CPU backend with a copy delay, so
// transfers really lag behind): cached device blocks are demoted to the host instead of dropped,
// a later prompt hits them there and its first reserve (or a prefetch) onboards them, bit-exact
// for every pool dtype; the host tier drops its least recently used blocks when full; demotion
// can be turned off; prefetch restores only what fits; seed defect 1 (a prefix entry pointing at
// a reused block) and seed defect 7 (an unbounded host store, synchronous copies) are absent;
// a backend failure during a demotion is taken back. check_invariants() runs after every step.
// On both backends (runtime_backends.hpp; the copy delay is the CPU backend's) except the two
// tests that assert a copy is still in flight.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/gated_transfers.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using std::chrono::milliseconds;
using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

// 4 device blocks of 4 tokens, 8 host blocks: a handful of sequences fill either tier.
CacheConfig small_config(DType dtype = DType::kFloat16) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.block_size = 4;
  c.num_device_blocks = 4;
  c.num_host_blocks = 8;
  c.dtype = dtype;
  c.backend = BackendKind::kCpu;
  return c;
}

std::vector<TokenId> iota_tokens(int n, TokenId first) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using testing::named_stats;
using testing::NamedStats;
using testing::stats_diff;

std::string where(const std::vector<BlockLocation>& blocks) {
  std::ostringstream os;
  for (const BlockLocation& b : blocks) os << (b.tier == Tier::kDevice ? " d" : " h") << b.block;
  return os.str();
}

class HostTierFixture : public ::testing::Test {
 protected:
  // Creates the cache on a backend of kind_: on the CPU backend, copy-stream copies sleep
  // `copy_delay` (a device's copies lag on their own); with
  // `inject_faults` the cache runs on a FaultInjectionBackend wrapping it (the test's own
  // uploads and downloads use the inner backend, so only the cache's calls are counted).
  // With `gated` the cache runs on a GatedTransfers wrapper (gated_): arm() holds its copies
  // until release().
  void make(CacheConfig config, std::chrono::microseconds copy_delay = milliseconds(5),
            bool inject_faults = false, bool gated = false) {
    cache_.reset();
    faults_.reset();
    gated_.reset();
    config.backend = kind_;
    config_ = config;
    CpuBackendOptions options;
    options.copy_delay = copy_delay;
    backend_ = testing::make_backend(kind_, options);
    ASSERT_NE(backend_, nullptr);
    KvCacheOptions o;
    o.backend = backend_.get();
    o.transfer_kernel_block_bytes = transfer_kernel_block_bytes_;
    if (inject_faults) {
      faults_ = std::make_unique<FaultInjectionBackend>(*backend_);
      o.backend = faults_.get();
    }
    if (gated) {
      gated_ = std::make_unique<testing::GatedTransfers>(*o.backend);
      o.backend = gated_.get();
    }
    auto c = KvCache::create(config, o);
    ASSERT_OK(c);
    cache_ = std::move(c).value();
  }

  void TearDown() override {
    cache_.reset();
    gated_.reset();
    faults_.reset();
  }

  void expect_invariants() {
    const Status s = cache_->check_invariants();
    EXPECT_OK(s);
  }

  // add_sequence, then the invariants.
  int64_t add(SequenceId id, const std::vector<TokenId>& prompt) {
    auto cached = cache_->add_sequence(id, prompt);
    EXPECT_OK(cached);
    expect_invariants();
    return cached.ok() ? *cached : -1;
  }

  // Reserves, writes every layer (fp16 model rows) and commits `tokens` at positions start...
  void append(SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    auto slots = cache_->reserve(id, static_cast<int64_t>(tokens.size()));
    ASSERT_OK(slots);
    ASSERT_EQ(slots->size(), tokens.size());
    expect_invariants();
    write_and_commit(id, tokens, start);
  }

  // Writes every layer of the reserved `tokens` and commits them.
  void write_and_commit(SequenceId id, const std::vector<TokenId>& tokens, int64_t start) {
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      const std::vector<uint16_t> k = model_rows(config_, layer, 0, tokens, start);
      const std::vector<uint16_t> v = model_rows(config_, layer, 1, tokens, start);
      DeviceBuffer dk(*backend_, k.size() * 2), dv(*backend_, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      const Status s = cache_->write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16);
      ASSERT_OK(s);
      ASSERT_OK(cache_->synchronize());  // the staging buffers go out of scope
    }
    ASSERT_OK(cache_->commit(id, tokens));
    expect_invariants();
  }

  // A sequence whose whole prompt is written and committed.
  void add_written(SequenceId id, const std::vector<TokenId>& prompt) {
    ASSERT_EQ(add(id, prompt), 0);
    append(id, prompt, 0);
  }

  // The bytes the pool must hold for an element: the fp16 model value stored in the pool dtype.
  void expected_element(int64_t pos, TokenId tok, int32_t layer, int32_t part, int32_t head,
                        int32_t d, uint8_t* out) const {
    std::vector<uint8_t> one(4);
    store_from_float(one.data(), config_.dtype, 0,
                     half_bits_to_float(kv_value(pos, tok, layer, part, head, d)));
    std::memcpy(out, one.data(), dtype_size(config_.dtype));
  }

  // Gathers every layer of `id` in the pool dtype and compares every byte with the model of
  // `tokens`.
  void expect_contents(SequenceId id, const std::vector<TokenId>& tokens) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const size_t es = dtype_size(config_.dtype);
    const size_t elems = static_cast<size_t>(n * config_.num_kv_heads * config_.head_dim);
    std::set<std::vector<uint8_t>> distinct;
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      DeviceBuffer k(*backend_, elems * es), v(*backend_, elems * es);
      const Status s = cache_->gather_layer(id, layer, k.data(), v.data(), config_.dtype,
                                            PackedLayout::kHeadMajor);
      ASSERT_OK(s) << "seq " << id;
      ASSERT_OK(cache_->synchronize());
      const std::vector<uint8_t> got[2] = {k.download<uint8_t>(), v.download<uint8_t>()};
      std::vector<uint8_t> want(es);
      for (int32_t part = 0; part < 2; ++part)
        for (int32_t h = 0; h < config_.num_kv_heads; ++h)
          for (int64_t t = 0; t < n; ++t)
            for (int32_t d = 0; d < config_.head_dim; ++d) {
              const size_t i = static_cast<size_t>((h * n + t) * config_.head_dim + d) * es;
              expected_element(t, tokens[static_cast<size_t>(t)], layer, part, h, d, want.data());
              const std::vector<uint8_t> have(
                  got[part].begin() + static_cast<std::ptrdiff_t>(i),
                  got[part].begin() + static_cast<std::ptrdiff_t>(i + es));
              ASSERT_EQ(have, want) << "seq " << id << " layer " << layer << " part " << part
                                    << " head " << h << " pos " << t << " dim " << d;
              if (distinct.size() < 64) distinct.insert(have);
            }
    }
    // The comparison means something only if the bytes vary.
    if (n > 1) {
      EXPECT_GT(distinct.size(), 8u) << "seq " << id;
    }
    expect_invariants();
  }

  // The body of the FailedDemotion tests: the last `fault` call of R's reserve fails.
  void failed_demotion_is_taken_back(FaultKind fault);

  SequenceResidency residency(SequenceId id) {
    auto r = cache_->residency(id);
    EXPECT_OK(r);
    return r.ok() ? *r : SequenceResidency::kHost;
  }

  std::vector<BlockLocation> locations(SequenceId id) {
    auto b = cache_->block_locations(id);
    EXPECT_OK(b);
    return b.ok() ? *b : std::vector<BlockLocation>{};
  }

  int64_t count_tier(SequenceId id, Tier tier) {
    int64_t n = 0;
    for (const BlockLocation& b : locations(id)) n += b.tier == tier ? 1 : 0;
    return n;
  }

  // Pushes every cached device block out of the device: a sequence with an empty prompt
  // reserves the whole pool (without writing), then is erased.
  void push_out_cached_device_blocks(SequenceId filler) {
    ASSERT_EQ(add(filler, {}), 0);
    auto slots = cache_->reserve(filler, config_.num_device_blocks * config_.block_size);
    ASSERT_OK(slots);
    expect_invariants();
    ASSERT_OK(cache_->erase(filler));
    expect_invariants();
  }

  // A prompt of `n` fresh tokens, distinct from every other prompt of the test.
  std::vector<TokenId> fresh(int n) {
    const std::vector<TokenId> t = iota_tokens(n, next_token_);
    next_token_ += 1000;
    return t;
  }

  BackendKind kind_ = BackendKind::kCpu;
  int64_t transfer_kernel_block_bytes_ = kDefaultTransferKernelBlockBytes;
  CacheConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<FaultInjectionBackend> faults_;
  std::unique_ptr<testing::GatedTransfers> gated_;  // over faults_ or backend_
  std::unique_ptr<KvCache> cache_;
  TokenId next_token_ = 1000;
};

// On both backends.
class HostTierTest : public HostTierFixture, public ::testing::WithParamInterface<BackendKind> {
 protected:
  void SetUp() override {
    kind_ = GetParam();
    testing::require_backend(kind_);
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, HostTierTest, testing::runtime_backends(),
                         testing::backend_param_name);

// CPU backend only: the test asserts that a (delayed) copy is still in flight.
class HostTierCpuTest : public HostTierFixture {};

// ---------------------------------------------------------------- a: host prefix hit

class HostPrefixHitDtypeTest
    : public HostTierFixture,
      public ::testing::WithParamInterface<std::tuple<DType, BackendKind>> {
 protected:
  void SetUp() override {
    kind_ = std::get<1>(GetParam());
    testing::require_backend(kind_);
  }
  DType dtype() const { return std::get<0>(GetParam()); }
};

// X's three cached prefix blocks are demoted when a filler sequence F needs the whole device
// pool (F's writes land in X's former blocks while the demotion copies still sleep). Z with X's
// prompt + 1 token hits all three on the host, and its first reserve onboards them in the same
// transfer job that offloads F: Z reads back X's bytes, and F its own.
TEST_P(HostPrefixHitDtypeTest, DemotedPrefixIsHitOnTheHostAndOnboardedBitExact) {
  make(small_config(dtype()), milliseconds(5));
  constexpr SequenceId kX = 1, kF = 2, kZ = 3;
  const std::vector<TokenId> px = fresh(12);  // three full blocks
  add_written(kX, px);
  ASSERT_OK(cache_->finish(kX));
  expect_invariants();
  const NamedStats s0 = named_stats(cache_->stats());
  EXPECT_EQ(s0.at("device.cached_blocks"), 3);

  const std::vector<TokenId> pf = fresh(16);  // the whole device pool
  add_written(kF, pf);
  const NamedStats s1 = named_stats(cache_->stats());
  EXPECT_EQ(s1.at("blocks_demoted") - s0.at("blocks_demoted"), 3);
  EXPECT_EQ(s1.at("blocks_evicted"), s0.at("blocks_evicted")) << "demoted, not dropped";
  EXPECT_EQ(s1.at("host.cached_blocks"), 3);
  EXPECT_EQ(s1.at("device.cached_blocks"), 0);
  expect_contents(kF, pf);

  const std::vector<TokenId> pz = concat(px, {77});
  EXPECT_EQ(add(kZ, pz), 12) << "the hit covers the three demoted blocks";
  EXPECT_EQ(residency(kZ), SequenceResidency::kHost);
  const std::vector<BlockLocation> z_blocks = locations(kZ);
  ASSERT_EQ(z_blocks.size(), 3u);
  for (const BlockLocation& b : z_blocks) EXPECT_EQ(b.tier, Tier::kHost) << where(z_blocks);
  const NamedStats s2 = named_stats(cache_->stats());
  EXPECT_EQ(s2.at("prefix_host_hit_blocks") - s1.at("prefix_host_hit_blocks"), 3);
  EXPECT_EQ(s2.at("prefix_hit_blocks") - s1.at("prefix_hit_blocks"), 3);
  EXPECT_EQ(s2.at("offloaded_sequences"), 1);

  // Onboards Z (3 blocks) and, for room, offloads F, in one job.
  auto slots = cache_->reserve(kZ, 1);
  ASSERT_OK(slots);
  expect_invariants();
  const SequenceResidency r = residency(kZ);
  EXPECT_TRUE(r == SequenceResidency::kInFlight || r == SequenceResidency::kDevice)
      << static_cast<int>(r);
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(kZ), SequenceResidency::kDevice);
  EXPECT_EQ(count_tier(kZ, Tier::kDevice), 4) << where(locations(kZ));
  EXPECT_EQ(residency(kF), SequenceResidency::kHost);
  write_and_commit(kZ, {77}, 12);
  expect_contents(kZ, pz);

  // F comes back (Z goes out) with its own bytes, and Z again with its.
  ASSERT_OK(cache_->restore(kF));
  expect_invariants();
  expect_contents(kF, pf);
  ASSERT_OK(cache_->restore(kZ));
  expect_invariants();
  expect_contents(kZ, pz);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, HostPrefixHitDtypeTest,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16,
                                                              DType::kFloat32, DType::kFloat8E4M3),
                                            testing::runtime_backends()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  testing::backend_label(std::get<1>(info.param));
                         });

// A prompt that hits a demoted prefix can be onboarded ahead of its first reserve by prefetch.
TEST_P(HostTierTest, PrefetchOnboardsAHostPrefixHit) {
  make(small_config(), milliseconds(5));
  constexpr SequenceId kX = 1, kFill = 2, kZ = 3;
  const std::vector<TokenId> px = fresh(8);
  add_written(kX, px);
  ASSERT_OK(cache_->finish(kX));
  push_out_cached_device_blocks(kFill);
  ASSERT_EQ(cache_->stats().blocks_demoted, 2);
  const std::vector<TokenId> pz = concat(px, {5, 6});
  EXPECT_EQ(add(kZ, pz), 8);
  EXPECT_EQ(residency(kZ), SequenceResidency::kHost);
  ASSERT_OK(cache_->prefetch({kZ}));
  expect_invariants();
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(kZ), SequenceResidency::kDevice);
  EXPECT_EQ(count_tier(kZ, Tier::kDevice), 2);
  append(kZ, {5, 6}, 8);
  expect_contents(kZ, pz);
}

// ---------------------------------------------------------------- b: host LRU

// Host pool of 6 blocks: prefixes A, B, C (2 blocks each) are demoted in that order, A is hit
// again (touched) after B, then D's demotion needs room: B, the least recently used, is dropped
// (FIFO would drop A).
TEST_P(HostTierTest, FullHostTierDropsItsLeastRecentlyUsedPrefix) {
  CacheConfig c = small_config();
  c.num_host_blocks = 6;
  make(c, milliseconds(1));
  SequenceId next_id = 1;
  auto demote_prefix = [&](const std::vector<TokenId>& prompt) {
    const SequenceId id = next_id++;
    add_written(id, prompt);
    ASSERT_OK(cache_->finish(id));
    push_out_cached_device_blocks(next_id++);
  };
  // A prompt of the prefix + 1 token: its hit, after which the probe is finished (its hit
  // touches the blocks and does not move them).
  auto probe = [&](const std::vector<TokenId>& prefix) {
    const SequenceId id = next_id++;
    const int64_t hit = add(id, concat(prefix, {9}));
    EXPECT_OK(cache_->finish(id));
    expect_invariants();
    return hit;
  };
  const std::vector<TokenId> a = fresh(8), b = fresh(8), cc = fresh(8), d = fresh(8);
  demote_prefix(a);
  demote_prefix(b);
  EXPECT_EQ(probe(a), 8);  // A is now more recently used than B
  demote_prefix(cc);
  ControlStats st = cache_->stats();
  EXPECT_EQ(st.blocks_demoted, 6);
  EXPECT_EQ(st.host.cached_blocks, 6);
  EXPECT_EQ(st.host.free_blocks, 0);
  EXPECT_EQ(st.host_blocks_dropped, 0);

  demote_prefix(d);
  st = cache_->stats();
  EXPECT_EQ(st.blocks_demoted, 8);
  EXPECT_EQ(st.blocks_evicted, 0);
  EXPECT_EQ(st.host_blocks_dropped, 2) << "both blocks of one prefix";
  EXPECT_EQ(st.host.cached_blocks, 6);

  const int64_t host_hits_before = cache_->stats().prefix_host_hit_blocks;
  EXPECT_EQ(probe(b), 0) << "B was the least recently used prefix on the host";
  EXPECT_EQ(probe(a), 8) << "A was touched after B: LRU, not FIFO, keeps it";
  EXPECT_EQ(probe(cc), 8);
  EXPECT_EQ(probe(d), 8);
  EXPECT_EQ(cache_->stats().prefix_host_hit_blocks - host_hits_before, 6);
}

// ---------------------------------------------------------------- c: demotion off

TEST_P(HostTierTest, WithoutCachingPrefixesOnHostCachedBlocksAreDropped) {
  CacheConfig c = small_config();
  c.cache_prefixes_on_host = false;
  make(c, milliseconds(1));
  const std::vector<TokenId> px = fresh(12);
  add_written(1, px);
  ASSERT_OK(cache_->finish(1));
  push_out_cached_device_blocks(2);
  const ControlStats st = cache_->stats();
  EXPECT_EQ(st.blocks_demoted, 0);
  EXPECT_EQ(st.blocks_evicted, 3);
  EXPECT_EQ(st.host.cached_blocks, 0);
  EXPECT_EQ(st.host.free_blocks, 8);
  EXPECT_EQ(add(3, concat(px, {1})), 0);
  EXPECT_EQ(cache_->stats().prefix_host_hit_blocks, 0);
  // The host tier still takes offloads.
  const std::vector<TokenId> py = fresh(8);
  add_written(4, py);
  ASSERT_OK(cache_->offload(4));
  expect_invariants();
  ASSERT_OK(cache_->restore(4));
  expect_contents(4, py);
}

// ---------------------------------------------------------------- d: prefetch

TEST_P(HostTierTest, PrefetchRestoresWhatFitsInListOrderAndNothingElse) {
  CacheConfig c = small_config();
  c.num_device_blocks = 6;
  make(c, milliseconds(10));
  constexpr SequenceId k1 = 1, k2 = 2, k3 = 3;
  const std::vector<TokenId> p1 = fresh(8), p2 = fresh(8), p3 = fresh(16);
  add_written(k1, p1);
  add_written(k2, p2);
  auto offload_both = [&] {
    ASSERT_OK(cache_->offload(k1));
    ASSERT_OK(cache_->offload(k2));
    expect_invariants();
    ASSERT_OK(cache_->synchronize());
    EXPECT_EQ(residency(k1), SequenceResidency::kHost);
    EXPECT_EQ(residency(k2), SequenceResidency::kHost);
  };
  offload_both();

  // Room for both.
  NamedStats before = named_stats(cache_->stats());
  ASSERT_OK(cache_->prefetch({k1, k2}));
  expect_invariants();
  for (SequenceId id : {k1, k2}) {
    const SequenceResidency r = residency(id);
    EXPECT_TRUE(r == SequenceResidency::kInFlight || r == SequenceResidency::kDevice);
  }
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(k1), SequenceResidency::kDevice);
  EXPECT_EQ(residency(k2), SequenceResidency::kDevice);
  NamedStats after = named_stats(cache_->stats());
  EXPECT_EQ(after.at("sequences_restored") - before.at("sequences_restored"), 2);
  EXPECT_EQ(after.at("blocks_restored") - before.at("blocks_restored"), 4);
  expect_contents(k1, p1);
  expect_contents(k2, p2);

  // Room for one: k3 (inactive, so a reserve could offload it) leaves 2 free device blocks.
  offload_both();
  add_written(k3, p3);
  const std::vector<BlockLocation> k3_blocks = locations(k3);
  before = named_stats(cache_->stats());
  ASSERT_EQ(before.at("device.free_blocks"), 2);
  ASSERT_OK(cache_->prefetch({k2, k1}));
  expect_invariants();
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(k2), SequenceResidency::kDevice) << "the first in the list";
  EXPECT_EQ(residency(k1), SequenceResidency::kHost) << "no room left for it";
  EXPECT_EQ(locations(k3), k3_blocks) << "prefetch never offloads another sequence";
  EXPECT_EQ(residency(k3), SequenceResidency::kDevice);
  EXPECT_TRUE(cache_->drain_evicted_sequences().empty()) << "nor drops one";
  after = named_stats(cache_->stats());
  NamedStats expected = before;
  expected["sequences_restored"] += 1;
  expected["blocks_restored"] += 2;
  expected["offloaded_sequences"] -= 1;
  expected["device.free_blocks"] -= 2;
  expected["device.used_blocks"] += 2;
  expected["host.free_blocks"] += 2;
  expected["host.used_blocks"] -= 2;
  expected["device.used_bytes"] += 2 * c.block_bytes();
  expected["host.used_bytes"] -= 2 * c.block_bytes();
  EXPECT_EQ(stats_diff(expected, after), "");
  expect_contents(k2, p2);
  expect_contents(k3, p3);

  // An unknown id: kNotFound and nothing queued, k1 included.
  before = named_stats(cache_->stats());
  const Status s = cache_->prefetch({k1, 999});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  expect_invariants();
  EXPECT_EQ(stats_diff(before, named_stats(cache_->stats())), "");
  EXPECT_EQ(residency(k1), SequenceResidency::kHost);

  // k1 still comes back whole once there is room.
  ASSERT_OK(cache_->finish(k3));
  ASSERT_OK(cache_->prefetch({k1}));
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(k1), SequenceResidency::kDevice);
  expect_contents(k1, p1);
}

// ---------------------------------------------------------------- e: seed defect 1

// Seed defect 1: offloading freed a sequence's blocks but left their prefix entries, so a later
// prompt could match a block since handed to another sequence. Here X is offloaded (its copies
// sleep 30 ms), Y at once writes different tokens into X's freed device blocks, and Z with X's
// prompt must read X's keys and values, never Y's.
TEST_F(HostTierCpuTest, SeedDefect1PrefixOfAnOffloadedSequenceNeverReadsReusedBlocks) {
  CacheConfig c = small_config();
  c.num_device_blocks = 3;
  make(c, milliseconds(30), false, /*gated=*/true);
  constexpr SequenceId kX = 1, kY = 2, kZ = 3;
  const std::vector<TokenId> px = fresh(8), py = fresh(12);
  add_written(kX, px);
  const std::vector<BlockLocation> x_device = locations(kX);
  gated_->arm();
  ASSERT_OK(cache_->offload(kX));
  EXPECT_EQ(residency(kX), SequenceResidency::kInFlight) << "the offload copies are held";
  gated_->release();  // and then sleep while Y takes X's freed blocks
  expect_invariants();

  add_written(kY, py);  // three blocks of three: X's two freed ones among them
  int reused = 0;
  for (const BlockLocation& b : locations(kY))
    for (const BlockLocation& x : x_device) reused += b == x ? 1 : 0;
  EXPECT_EQ(reused, 2) << "Y took X's freed device blocks";
  expect_contents(kY, py);

  const std::vector<TokenId> pz = concat(px, {4242});
  EXPECT_EQ(add(kZ, pz), 8);
  EXPECT_EQ(residency(kZ), SequenceResidency::kHost) << "the prefix is X's host copy";
  append(kZ, {4242}, 8);  // onboards X's prefix, offloading Y for room
  expect_contents(kZ, pz);
  ASSERT_OK(cache_->restore(kX));
  expect_invariants();
  expect_contents(kX, px);
}

// ---------------------------------------------------------------- f: seed defect 7

// Seed defect 7, part 1: the host store was unbounded. Here an offload that needs more host
// blocks than are free (and than cached host blocks could give) fails and changes nothing.
TEST_P(HostTierTest, SeedDefect7HostTierIsBoundedAndAFailedOffloadChangesNothing) {
  CacheConfig c = small_config();
  c.num_device_blocks = 8;
  c.num_host_blocks = 4;
  make(c, milliseconds(1));
  constexpr SequenceId k1 = 1, k2 = 2;
  const std::vector<TokenId> p1 = fresh(12), p2 = fresh(8);
  add_written(k1, p1);
  add_written(k2, p2);
  ASSERT_OK(cache_->offload(k1));  // 3 of the 4 host blocks
  expect_invariants();
  const NamedStats before = named_stats(cache_->stats());
  const std::vector<BlockLocation> b1 = locations(k1), b2 = locations(k2);
  const Status s = cache_->offload(k2);  // needs 2
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  expect_invariants();
  EXPECT_EQ(stats_diff(before, named_stats(cache_->stats())), "");
  EXPECT_EQ(locations(k1), b1);
  EXPECT_EQ(locations(k2), b2);
  EXPECT_EQ(residency(k2), SequenceResidency::kDevice);
  expect_contents(k2, p2);

  // Once k1 is finished its host blocks are cached and droppable: the offload now fits.
  ASSERT_OK(cache_->finish(k1));
  expect_invariants();
  EXPECT_EQ(cache_->stats().host.cached_blocks, 3);
  ASSERT_OK(cache_->offload(k2));
  expect_invariants();
  EXPECT_EQ(cache_->stats().host_blocks_dropped, 1);
  ASSERT_OK(cache_->restore(k2));
  expect_contents(k2, p2);
}

// The bound counts every cached host block as room, not only the leaves of the prefix tree: a
// finished sequence's whole chain on the host can be dropped (leaf first) for an offload.
TEST_P(HostTierTest, OffloadCanUseHostRoomHeldByACachedChain) {
  CacheConfig c = small_config();
  c.num_device_blocks = 8;
  c.num_host_blocks = 4;
  make(c, milliseconds(1));
  constexpr SequenceId k1 = 1, k2 = 2;
  const std::vector<TokenId> p1 = fresh(16), p2 = fresh(12);
  add_written(k1, p1);
  add_written(k2, p2);
  ASSERT_OK(cache_->offload(k1));  // all 4 host blocks
  ASSERT_OK(cache_->finish(k1));   // a chain of 4 cached host blocks, droppable
  expect_invariants();
  ASSERT_EQ(cache_->stats().host.cached_blocks, 4);
  ASSERT_EQ(cache_->stats().host.free_blocks, 0);
  const Status s = cache_->offload(k2);  // needs 3: dropping 3 of the 4 gives them
  EXPECT_OK(s);
  expect_invariants();
  if (!s.ok()) return;
  EXPECT_EQ(cache_->stats().host_blocks_dropped, 3);
  ASSERT_OK(cache_->restore(k2));
  expect_contents(k2, p2);
}

// Seed defect 7, part 2: the seed's copies were synchronous. offload() and restore() return
// while their copies are still held back; residency says kInFlight until they ran.
TEST_F(HostTierCpuTest, SeedDefect7OffloadAndRestoreAreAsynchronous) {
  make(small_config(), milliseconds(0), false, /*gated=*/true);
  const std::vector<TokenId> p = fresh(8);
  add_written(1, p);
  // The copies are held at a gate until release(): a call that waited for its copy would never
  // return, so each runs on another thread, which must finish while the gate is still closed.
  auto returns_with_copies_held = [&](const std::function<Status()>& call) {
    gated_->arm();
    auto done = std::async(std::launch::async, call);
    const bool returned = done.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    EXPECT_TRUE(returned) << "the call waited for its copy";
    if (returned) {
      EXPECT_EQ(residency(1), SequenceResidency::kInFlight);
    }
    gated_->release();
    EXPECT_OK(done.get());
  };
  returns_with_copies_held([&] { return cache_->offload(1); });
  expect_invariants();
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(1), SequenceResidency::kHost);

  returns_with_copies_held([&] { return cache_->restore(1); });
  expect_invariants();
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(1), SequenceResidency::kDevice);
  expect_contents(1, p);
}

// ---------------------------------------------------------------- g: failure in a demotion

// R's reserve needs the whole device pool: it offloads victim V and demotes Q's cached prefix
// in one transfer job. The job's last copy call fails (with batched copies the offload and the
// demotions, all device -> host, are one copy_batch; on the copy kernel path the last launch,
// the job's one kernel): the reserve returns the injected kInternal error and nothing changed;
// Q's prefix still hits on the device with its bytes, V reads back whole, and a retry succeeds.
TEST_P(HostTierTest, FailedDemotionIsTakenBack) {
  transfer_kernel_block_bytes_ = 0;  // batched copies
  failed_demotion_is_taken_back(FaultKind::kCopy);
}

TEST_P(HostTierTest, FailedDemotionKernelIsTakenBack) {
  transfer_kernel_block_bytes_ = int64_t{1} << 40;  // the copy kernel for any block
  failed_demotion_is_taken_back(FaultKind::kLaunch);
}

void HostTierFixture::failed_demotion_is_taken_back(FaultKind fault) {
  constexpr SequenceId kQ = 1, kV = 2, kR = 3, kZ = 4, kW = 5;
  const std::vector<TokenId> pq = iota_tokens(8, 100), pv = iota_tokens(8, 200);
  const std::vector<TokenId> pr = iota_tokens(16, 300);
  // Builds the scenario up to R's reserve on a fresh cache.
  auto setup = [&] {
    make(small_config(), milliseconds(2), /*inject_faults=*/true);
    ASSERT_EQ(cache_->pool_info().transfer_kernel, fault == FaultKind::kLaunch);
    add_written(kQ, pq);
    ASSERT_OK(cache_->finish(kQ));
    add_written(kV, pv);
    ASSERT_EQ(add(kR, {}), 0);
    ASSERT_OK(cache_->set_active({kR}));
    ASSERT_EQ(cache_->stats().device.cached_blocks, 2);
    ASSERT_EQ(cache_->stats().device.free_blocks, 0);
  };

  // A fault-free run counts the copy (or launch) calls of R's reserve (one per direction and
  // batch).
  setup();
  if (::testing::Test::HasFatalFailure()) return;
  faults_->reset_counts();
  ASSERT_OK(cache_->reserve(kR, 16));
  const int64_t copies = faults_->count(fault);
  const ControlStats clean = cache_->stats();
  EXPECT_EQ(clean.blocks_demoted, 2);
  EXPECT_EQ(clean.sequences_offloaded, 1);
  ASSERT_GE(copies, 1) << "R's reserve must move blocks";

  setup();
  if (::testing::Test::HasFatalFailure()) return;
  std::map<SequenceId, std::pair<std::vector<BlockLocation>, std::pair<int64_t, int64_t>>> was;
  for (SequenceId id : {kV, kR}) {
    was[id] = {locations(id), {*cache_->length(id), *cache_->pending(id)}};
  }
  const NamedStats before = named_stats(cache_->stats());
  faults_->reset_counts();
  faults_->fail_nth(fault, copies);
  auto failed = cache_->reserve(kR, 16);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_NE(
      failed.status().message().find(std::string("injected fault: ") + fault_kind_name(fault)),
      std::string::npos)
      << failed.status().to_string();
  EXPECT_EQ(faults_->injected(), 1);
  expect_invariants();
  for (SequenceId id : {kV, kR}) {
    EXPECT_EQ(locations(id), was[id].first) << "seq " << id << ":" << where(locations(id));
    EXPECT_EQ(*cache_->length(id), was[id].second.first);
    EXPECT_EQ(*cache_->pending(id), was[id].second.second);
  }
  EXPECT_EQ(stats_diff(before, named_stats(cache_->stats())), "");
  ASSERT_OK(cache_->synchronize());
  EXPECT_EQ(residency(kV), SequenceResidency::kDevice);
  expect_contents(kV, pv);

  // Q's prefix is cached on the device again, with its bytes.
  const std::vector<TokenId> pz = concat(pq, {999});
  EXPECT_EQ(add(kZ, pz), 8);
  EXPECT_EQ(residency(kZ), SequenceResidency::kDevice);
  append(kZ, {999}, 8);  // offloads V for room
  expect_contents(kZ, pz);
  ASSERT_OK(cache_->finish(kZ));
  expect_invariants();

  // The retry demotes Q's prefix for real.
  const int64_t demoted = cache_->stats().blocks_demoted;
  append(kR, pr, 0);
  EXPECT_EQ(cache_->stats().blocks_demoted - demoted, 2);
  expect_contents(kR, pr);
  ASSERT_OK(cache_->set_active({}));
  ASSERT_OK(cache_->restore(kV));
  expect_invariants();
  expect_contents(kV, pv);
  const std::vector<TokenId> pw = concat(pq, {1234});
  EXPECT_EQ(add(kW, pw), 8);
  EXPECT_EQ(residency(kW), SequenceResidency::kHost) << "Q's prefix now lives on the host";
  EXPECT_EQ(faults_->injected(), 1);
}

// ---------------------------------------------------------------- stats

// ControlStats documents prefix_host_hit_blocks as "of prefix_hit_blocks, those found on the
// host tier". A prompt that is exactly a cached prefix leaves its last token to compute, so its
// last block is reused by copy-on-write and is not a hit block; it must not be a host hit block
// either.
TEST_P(HostTierTest, HostHitBlocksArePartOfHitBlocks) {
  make(small_config(), milliseconds(1));
  const std::vector<TokenId> px = fresh(8);
  add_written(1, px);
  ASSERT_OK(cache_->finish(1));
  push_out_cached_device_blocks(2);
  ASSERT_EQ(cache_->stats().blocks_demoted, 2);
  EXPECT_EQ(add(3, px), 7);  // the same prompt: one full block and 3 tokens of the second
  const ControlStats st = cache_->stats();
  EXPECT_EQ(st.prefix_hit_blocks, 1);
  EXPECT_LE(st.prefix_host_hit_blocks, st.prefix_hit_blocks);
  // The data is right either way.
  append(3, {px.back()}, 7);
  expect_contents(3, px);
}

}  // namespace
}  // namespace pagedkv
