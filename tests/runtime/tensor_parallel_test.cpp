// Tensor parallelism (KvCacheOptions::tp_size): one control plane driving N pools, rank r holding
// KV heads [r*H/N, (r+1)*H/N) of every block. N backends stand for N GPUs, each with its own
// memory limit and its own copy delay (so the ranks' transfers finish in different orders).
//
// - A randomized run (prefix hits, prefill chunks, decode steps through rank_batch, fork and
//   copy-on-write, offload, restore, prefetch, rollback, eviction under pressure in both tiers,
//   finish, erase) drives a TP cache and an unsharded cache of the same config with the same
//   calls: every call answers the same, every sequence has the same blocks, and the ranks' heads
//   gathered side by side equal the unsharded cache's bytes, which equal the model's, and the
//   TP cache's one event stream is the unsharded cache's. One group, and two groups (full
//   attention and a window) sharing the blocks.
// - A fault on the first or the last rank in the middle of a move or a copy-on-write: the call
//   fails, and every rank's bytes, every block location and every residency are as before; the
//   retry succeeds.
// - A storage tier of a store per rank: the same prompts on an unsharded cache with one store
//   and a TP cache with N, under pressure that writes host blocks back: the same fetches, hits,
//   counters and events, every rank's heads of a fetched block are the model's, and after a
//   restart over the same stores both fetch the same prompts again.
// - What a TP cache refuses, and where each rank's pools are.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/null_storage.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::backend_label;
using testing::DeviceBuffer;
using testing::model_rows;

CacheConfig tp_config(BackendKind kind) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 4;
  c.head_dim = 6;
  c.block_size = 4;
  c.num_device_blocks = 20;
  c.num_host_blocks = 12;
  c.backend = kind;
  return c;
}

// A K/V group of the model's `layers`, `heads` heads of `dim`, a window of `window` tokens (0:
// full attention), and pools of `device` and `host` blocks.
KvGroup kv_group(const char* name, std::vector<int32_t> layers, int32_t heads, int32_t dim,
                 int32_t window, int64_t device, int64_t host) {
  KvGroup g;
  g.name = name;
  g.layers = std::move(layers);
  g.num_kv_heads = heads;
  g.head_dim = dim;
  g.sliding_window = window;
  g.num_device_blocks = device;
  g.num_host_blocks = host;
  return g;
}

// A model of two groups sharing the blocks: full attention on layers 0 and 2 (8 heads of 4),
// a sliding window of 8 tokens on layer 1 (4 heads of 10).
CacheConfig two_group_config(BackendKind kind) {
  CacheConfig c = tp_config(kind);
  c.num_layers = 3;
  c.groups = {kv_group("full", {0, 2}, 8, 4, 0, 20, 12), kv_group("window", {1}, 4, 10, 8, 20, 12)};
  return c;
}

// Model layer `layer`'s group config in `cache` (every head), and its group.
const CacheConfig& layer_config(KvCache& cache, int32_t layer, int32_t* group = nullptr) {
  const int32_t g = cache.layer_group(layer).value().group;
  if (group != nullptr) *group = g;
  return cache.group_config(g);
}

// Heads [first, first + count) of token-major rows [n, heads, head_dim].
std::vector<uint16_t> head_slice(const std::vector<uint16_t>& rows, const CacheConfig& c,
                                 int32_t first, int32_t count) {
  const size_t d = static_cast<size_t>(c.head_dim);
  const size_t row = static_cast<size_t>(c.num_kv_heads) * d;
  std::vector<uint16_t> out;
  for (size_t t = 0; t < rows.size() / row; ++t) {
    const auto begin = rows.begin() + static_cast<std::ptrdiff_t>(t * row + first * d);
    out.insert(out.end(), begin, begin + static_cast<std::ptrdiff_t>(count * d));
  }
  return out;
}

// The ranks' rows [n, heads / N, head_dim] side by side: [n, heads, head_dim].
std::vector<uint16_t> join_heads(const std::vector<std::vector<uint16_t>>& parts, size_t n) {
  std::vector<uint16_t> out;
  for (size_t t = 0; t < n; ++t) {
    for (const std::vector<uint16_t>& p : parts) {
      const size_t row = p.size() / n;
      out.insert(out.end(), p.begin() + static_cast<std::ptrdiff_t>(t * row),
                 p.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
    }
  }
  return out;
}

// N rank backends (the CPU ones with a memory limit that fits one rank's pools and their uploads,
// and a copy delay that differs by rank), and a cache over them.
struct Deployment {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<FaultInjectionBackend>> faults;  // one per rank, when wrapped
  std::unique_ptr<KvCache> cache;

  Backend& rank_backend(int32_t r) { return *backends[static_cast<size_t>(r)]; }
};

Deployment make_deployment(BackendKind kind, const CacheConfig& config, int32_t tp,
                           bool wrap_faults = false, std::vector<StorageTier*> rank_storage = {}) {
  Deployment d;
  KvCacheOptions o;
  o.tp_size = tp;
  o.rank_storage = std::move(rank_storage);
  for (int32_t r = 0; r < tp; ++r) {
    CpuBackendOptions cpu;
    int64_t pools = 0;  // one rank's device pools
    for (int32_t g = 0; g < config.num_groups(); ++g) {
      const CacheConfig c = config.group_config(g);
      pools += c.block_bytes() / tp * c.num_device_blocks;
    }
    cpu.device_memory_limit = static_cast<size_t>(pools) + (size_t{4} << 20);
    cpu.copy_delay = std::chrono::microseconds(40 * (tp - r));
    d.backends.push_back(testing::make_backend(kind, cpu));
    if (d.backends.back() == nullptr) return d;
    if (wrap_faults) {
      d.faults.push_back(std::make_unique<FaultInjectionBackend>(*d.backends.back()));
      o.rank_backends.push_back(d.faults.back().get());
    } else {
      o.rank_backends.push_back(d.backends.back().get());
    }
  }
  auto cache = KvCache::create(config, o);
  EXPECT_OK(cache);
  if (cache.ok()) d.cache = std::move(cache).value();
  return d;
}

// Writes the model's K/V of `tokens` at positions start.. into every layer of the reservation
// of `id` (the unsharded cache: every head; a TP cache: each rank its heads), then commits them.
void write_and_commit(KvCache& cache, const std::vector<Backend*>& backends, SequenceId id,
                      const std::vector<TokenId>& tokens, int64_t start) {
  const int32_t tp = cache.tp_size();
  for (int32_t layer = 0; layer < cache.config().num_layers; ++layer) {
    const CacheConfig& c = layer_config(cache, layer);
    const int32_t h = c.num_kv_heads / tp;
    for (int32_t r = 0; r < tp; ++r) {
      const std::vector<uint16_t> k =
          head_slice(model_rows(c, layer, 0, tokens, start), c, r * h, h);
      const std::vector<uint16_t> v =
          head_slice(model_rows(c, layer, 1, tokens, start), c, r * h, h);
      DeviceBuffer dk(*backends[static_cast<size_t>(r)], k.size() * 2);
      DeviceBuffer dv(*backends[static_cast<size_t>(r)], v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      ASSERT_OK(cache.write_kv(id, layer, dk.data(), dv.data(), DType::kFloat16, 0, r));
      ASSERT_OK(cache.synchronize());  // the buffers go when this returns
    }
  }
  ASSERT_OK(cache.commit(id, tokens));
}

// The first position a sequence of `length` tokens still holds in a layer of config `c`: the
// block holding the first token of its window (0 without one).
int64_t first_held(const CacheConfig& c, int64_t length) {
  if (c.sliding_window == 0) return 0;
  return std::max<int64_t>(0, length - c.sliding_window) / c.block_size * c.block_size;
}

// One layer's keys and values of a device-resident sequence from first_held() on, every head,
// token-major: a TP cache's ranks gathered side by side.
std::vector<uint16_t> gather_all_heads(KvCache& cache, const std::vector<Backend*>& backends,
                                       SequenceId id, int32_t layer) {
  const CacheConfig& c = layer_config(cache, layer);
  const int64_t begin = first_held(c, cache.length(id).value());
  const int64_t n = cache.length(id).value() - begin;
  const int32_t tp = cache.tp_size();
  std::vector<std::vector<uint16_t>> keys, values;
  for (int32_t r = 0; r < tp; ++r) {
    const size_t bytes = static_cast<size_t>(n * (c.num_kv_heads / tp) * c.head_dim * 2);
    DeviceBuffer k(*backends[static_cast<size_t>(r)], bytes);
    DeviceBuffer v(*backends[static_cast<size_t>(r)], bytes);
    EXPECT_OK(cache.gather_layer(id, layer, k.data(), v.data(), DType::kFloat16,
                                 PackedLayout::kTokenMajor, begin, -1, r));
    keys.push_back(k.download<uint16_t>());
    values.push_back(v.download<uint16_t>());
  }
  std::vector<uint16_t> out = join_heads(keys, static_cast<size_t>(n));
  const std::vector<uint16_t> vs = join_heads(values, static_cast<size_t>(n));
  out.insert(out.end(), vs.begin(), vs.end());
  return out;
}

// The model's keys and values of layer `layer` over what gather_all_heads reads.
std::vector<uint16_t> model_layer(KvCache& cache, const std::vector<TokenId>& tokens,
                                  int32_t layer) {
  const CacheConfig& c = layer_config(cache, layer);
  const int64_t begin = first_held(c, static_cast<int64_t>(tokens.size()));
  const std::vector<TokenId> held(tokens.begin() + begin, tokens.end());
  std::vector<uint16_t> out = model_rows(c, layer, 0, held, begin);
  const std::vector<uint16_t> v = model_rows(c, layer, 1, held, begin);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

std::vector<Backend*> backends_of(KvCache& cache) {
  std::vector<Backend*> out;
  for (int32_t r = 0; r < cache.tp_size(); ++r) out.push_back(&cache.backend(r));
  return out;
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<BackendKind, int32_t, bool>> {
 protected:
  void SetUp() override { testing::require_backend(kind()); }
  BackendKind kind() const { return std::get<0>(GetParam()); }
  int32_t tp() const { return std::get<1>(GetParam()); }
  // One group, or two_group_config's two.
  CacheConfig config() const {
    return std::get<2>(GetParam()) ? two_group_config(kind()) : tp_config(kind());
  }
};

// The randomized run: the same calls on an unsharded cache and a TP cache.
TEST_P(TensorParallel, RanksHoldTheSameBlocksAndTheirHeadsJoinToTheUnshardedCache) {
  const CacheConfig config = this->config();
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Deployment ranks = make_deployment(kind(), config, tp());
    ASSERT_NE(ranks.cache, nullptr);
    std::unique_ptr<Backend> one_backend = testing::make_backend(kind());
    ASSERT_NE(one_backend, nullptr);
    KvCacheOptions o;
    o.backend = one_backend.get();
    auto made = KvCache::create(config, o);
    ASSERT_OK(made);
    KvCache& ref = **made;
    KvCache& sharded = *ranks.cache;
    EXPECT_EQ(sharded.tp_size(), tp());
    const std::vector<Backend*> ref_backends{one_backend.get()};
    const std::vector<Backend*> tp_backends = backends_of(sharded);

    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    const std::vector<TokenId> system = {11, 12, 13, 14, 15, 16, 17, 18, 19};
    std::map<SequenceId, std::vector<TokenId>> live;  // committed tokens
    SequenceId next_id = 1;
    int64_t steps_with_pressure = 0;
    int64_t events_seen = 0;

    // Same answer from both caches (the status code; the value when both succeed).
    auto same = [&](const char* what, const Status& a, const Status& b) {
      EXPECT_EQ(a.code(), b.code()) << what << ": " << a.to_string() << " vs " << b.to_string();
      return a.ok() && b.ok();
    };
    auto forget_evicted = [&] {
      const std::vector<SequenceId> a = ref.drain_evicted_sequences();
      EXPECT_EQ(a, sharded.drain_evicted_sequences());
      for (SequenceId id : a) live.erase(id);
      steps_with_pressure += a.empty() ? 0 : 1;
    };
    auto extend = [&](SequenceId id, const std::vector<TokenId>& tokens) {
      const int64_t start = static_cast<int64_t>(live[id].size());
      const int64_t n = static_cast<int64_t>(tokens.size());
      if (n == 0) return;
      auto a = ref.reserve(id, n);
      auto b = sharded.reserve(id, n);
      forget_evicted();
      if (!same("reserve", a.status(), b.status())) return;
      EXPECT_EQ(*a, *b);
      write_and_commit(ref, ref_backends, id, tokens, start);
      write_and_commit(sharded, tp_backends, id, tokens, start);
      live[id].insert(live[id].end(), tokens.begin(), tokens.end());
    };

    for (int step = 0; step < 160; ++step) {
      const int op = pick(10);
      std::vector<SequenceId> ids;
      for (const auto& [id, tokens] : live) ids.push_back(id);
      const SequenceId any =
          ids.empty() ? 0 : ids[static_cast<size_t>(pick(static_cast<int>(ids.size())))];
      if (op <= 1 || ids.empty()) {  // a new prompt, often behind the shared system prompt
        std::vector<TokenId> prompt;
        if (pick(3) != 0) prompt.assign(system.begin(), system.begin() + 1 + pick(9));
        for (int i = pick(9); i >= 0; --i) prompt.push_back(100 + pick(50));
        const SequenceId id = next_id++;
        auto a = ref.add_sequence(id, prompt);
        auto b = sharded.add_sequence(id, prompt);
        if (!same("add_sequence", a.status(), b.status())) continue;
        EXPECT_EQ(*a, *b);
        live[id] = {};
        const std::vector<TokenId> cached(prompt.begin(), prompt.begin() + *a);
        live[id] = cached;
        // The cached prefix is the model's already; write the rest.
        extend(id, std::vector<TokenId>(prompt.begin() + *a, prompt.end()));
      } else if (op == 2) {  // a prefill chunk or a single token
        std::vector<TokenId> more(static_cast<size_t>(1 + pick(6)));
        for (TokenId& t : more) t = 200 + pick(50);
        extend(any, more);
      } else if (op == 3) {  // a decode step through the batch, each rank its own batch
        std::vector<SequenceId> batch;
        for (SequenceId id : ids) {
          if (pick(2) == 0) batch.push_back(id);
        }
        if (batch.empty()) continue;
        Status a = ref.reserve_batch_into(batch, 1, nullptr);
        Status b = sharded.reserve_batch_into(batch, 1, nullptr);
        forget_evicted();
        if (!same("reserve_batch", a, b)) continue;
        std::vector<TokenId> next;
        std::vector<int64_t> positions;
        for (SequenceId id : batch) {
          next.push_back(300 + pick(50));
          positions.push_back(static_cast<int64_t>(live[id].size()));
        }
        for (KvCache* cache : {&ref, &sharded}) {
          auto built = cache->build_batches(batch);
          ASSERT_OK(built);
          for (int32_t layer = 0; layer < config.num_layers; ++layer) {
            int32_t g = 0;
            const CacheConfig& c = layer_config(*cache, layer, &g);
            const int32_t h = c.num_kv_heads / cache->tp_size();
            for (int32_t r = 0; r < cache->tp_size(); ++r) {
              auto mine = cache->rank_batch((*built)[static_cast<size_t>(g)], r);
              ASSERT_OK(mine);
              EXPECT_EQ(mine->rank, r);
              EXPECT_EQ(mine->group, g);
              const size_t rows = mine->host->slot_mapping.size();
              const auto k =
                  head_slice(testing::step_rows(c, layer, 0, next, positions, rows), c, r * h, h);
              const auto v =
                  head_slice(testing::step_rows(c, layer, 1, next, positions, rows), c, r * h, h);
              DeviceBuffer dk(cache->backend(r), k.size() * 2), dv(cache->backend(r), v.size() * 2);
              dk.upload(k);
              dv.upload(v);
              ASSERT_OK(cache->write_kv_batch(*mine, layer, dk.data(), dv.data(), DType::kFloat16));
              ASSERT_OK(cache->synchronize());
            }
          }
          ASSERT_OK(cache->commit_batch(batch, next));
        }
        for (size_t i = 0; i < batch.size(); ++i) live[batch[i]].push_back(next[i]);
      } else if (op == 4) {
        const SequenceId child = next_id++;
        if (same("fork", ref.fork(any, child), sharded.fork(any, child))) live[child] = live[any];
      } else if (op == 5) {
        same("offload", ref.offload(any), sharded.offload(any));
      } else if (op == 6) {
        same("restore", ref.restore(any), sharded.restore(any));
        forget_evicted();
      } else if (op == 7) {
        same("prefetch", ref.prefetch(ids), sharded.prefetch(ids));
      } else if (op == 8) {
        const int64_t to = static_cast<int64_t>(live[any].size()) - pick(3);
        if (to >= 0 && same("rollback", ref.rollback(any, to), sharded.rollback(any, to))) {
          live[any].resize(static_cast<size_t>(to));
        }
      } else {
        const bool finish = pick(2) == 0;
        if (finish ? same("finish", ref.finish(any), sharded.finish(any))
                   : same("erase", ref.erase(any), sharded.erase(any))) {
          live.erase(any);
        }
      }
      ASSERT_OK(ref.check_invariants());
      ASSERT_OK(sharded.check_invariants());
      // One event stream for the deployment, the unsharded cache's.
      const std::vector<ControlEvent> ref_events = ref.drain_events();
      const std::vector<ControlEvent> tp_events = sharded.drain_events();
      ASSERT_EQ(ref_events.size(), tp_events.size());
      for (size_t i = 0; i < ref_events.size(); ++i) {
        const ControlEvent& x = ref_events[i];
        const ControlEvent& y = tp_events[i];
        EXPECT_TRUE(x.kind == y.kind && x.tier == y.tier && x.sequence == y.sequence &&
                    x.block_hash == y.block_hash && x.parent_hash == y.parent_hash &&
                    x.tokens == y.tokens && x.group == y.group)
            << "event " << i << " of step " << step;
      }
      events_seen += static_cast<int64_t>(tp_events.size());
      for (const auto& [id, tokens] : live) {
        ASSERT_EQ(ref.block_locations(id).value(), sharded.block_locations(id).value())
            << "sequence " << id;
      }
      if (step % 8 != 7) continue;
      // Every device-resident sequence reads back the same bytes from both, the model's.
      for (const auto& [id, tokens] : live) {
        auto residency = sharded.residency(id);
        ASSERT_OK(residency);
        // In flight may be an offload, whose sequence is read only after a restore.
        if (*residency != SequenceResidency::kDevice || tokens.empty()) continue;
        for (int32_t layer = 0; layer < config.num_layers; ++layer) {
          const std::vector<uint16_t> expect = model_layer(ref, tokens, layer);
          ASSERT_EQ(gather_all_heads(ref, ref_backends, id, layer), expect)
              << "unsharded, sequence " << id << " layer " << layer;
          ASSERT_EQ(gather_all_heads(sharded, tp_backends, id, layer), expect)
              << "tp " << tp() << ", sequence " << id << " layer " << layer;
        }
      }
    }
    EXPECT_GT(events_seen, 0);
    EXPECT_GT(steps_with_pressure + sharded.stats().sequences_offloaded, 0)
        << "the run never ran out of device blocks";
  }
}

// A fault on one rank while a call moves or copies blocks: nothing changes on any rank.
TEST_P(TensorParallel, AFaultOnOneRankMidMoveChangesNothingOnAnyRank) {
  CacheConfig config = this->config();
  config.num_device_blocks = 6;
  for (KvGroup& g : config.groups) g.num_device_blocks = 6;
  // Each call under test, from the same starting point: four sequences (one a fork of another
  // whose last block is partial), one of them offloaded, one device block free. Restoring it
  // offloads another in the same call, whose device blocks it may then overwrite: a rank whose
  // moves ran must copy them back.
  struct Call {
    const char* name;
    std::function<Status(KvCache&)> run;
  };
  const std::vector<Call> calls = {
      {"offload", [](KvCache& c) { return c.offload(1); }},
      {"restore (offloads another in the same call)", [](KvCache& c) { return c.restore(3); }},
      {"reserve after fork (copy-on-write)", [](KvCache& c) { return c.reserve(2, 2).status(); }},
      {"prefetch", [](KvCache& c) { return c.prefetch({3}); }},
  };
  const std::vector<TokenId> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::vector<TokenId> b = {40, 41, 42, 43, 44, 45, 46};
  const std::vector<TokenId> e = {70, 71, 72, 73, 74};
  int64_t failed_calls = 0;
  // The first rank (nothing queued anywhere else yet) and the last (every other rank has run
  // its part).
  for (const int32_t faulty : {0, tp() - 1})
    for (const Call& call : calls) {
      for (FaultKind fault : {FaultKind::kCopy, FaultKind::kLaunch, FaultKind::kEvent}) {
        for (int64_t n = 1;; ++n) {
          SCOPED_TRACE(std::string(call.name) + ", rank " + std::to_string(faulty) + "'s " +
                       fault_kind_name(fault) + " #" + std::to_string(n));
          Deployment d = make_deployment(kind(), config, tp(), /*wrap_faults=*/true);
          ASSERT_NE(d.cache, nullptr);
          KvCache& cache = *d.cache;
          const std::vector<Backend*> backends = backends_of(cache);
          ASSERT_OK(cache.add_sequence(1, {}));
          ASSERT_OK(cache.reserve(1, static_cast<int64_t>(a.size())));
          write_and_commit(cache, backends, 1, a, 0);
          ASSERT_OK(cache.fork(1, 2));
          ASSERT_OK(cache.add_sequence(3, {}));
          ASSERT_OK(cache.reserve(3, static_cast<int64_t>(b.size())));
          write_and_commit(cache, backends, 3, b, 0);
          ASSERT_OK(cache.offload(3));
          ASSERT_OK(cache.add_sequence(4, {}));
          ASSERT_OK(cache.reserve(4, static_cast<int64_t>(e.size())));
          write_and_commit(cache, backends, 4, e, 0);
          ASSERT_OK(cache.synchronize());
          const std::map<SequenceId, std::vector<TokenId>> tokens = {
              {1, a}, {2, a}, {3, b}, {4, e}};
          // What must stay: locations, residencies, and the bytes of what is on the device.
          auto snapshot = [&] {
            std::vector<std::string> out;
            for (const auto& [id, t] : tokens) {
              const std::vector<BlockLocation> where = cache.block_locations(id).value();
              std::string s = "seq " + std::to_string(id) + ":";
              for (const BlockLocation& l : where) {
                s += " " + std::to_string(static_cast<int>(l.tier)) + "/" + std::to_string(l.block);
              }
              s += " pending " + std::to_string(cache.pending(id).value());
              const SequenceResidency res = cache.residency(id).value();
              s += " residency " + std::to_string(static_cast<int>(res));
              out.push_back(s);
            }
            return out;
          };
          const std::vector<std::string> before = snapshot();
          FaultInjectionBackend& broken = *d.faults[static_cast<size_t>(faulty)];
          broken.reset_counts();
          broken.fail_nth(fault, n);
          const Status st = call.run(cache);
          const bool fired = broken.injected() > 0;
          broken.disarm_all();
          ASSERT_OK(cache.check_invariants());
          if (!fired) {
            // n is past the call's last call of that kind: it succeeded, and the sweep is done.
            EXPECT_OK(st);
            break;
          }
          ASSERT_FALSE(st.ok()) << "the fault was swallowed";
          EXPECT_NE(st.message().find("nothing changed"), std::string::npos) << st.to_string();
          ++failed_calls;
          ASSERT_OK(cache.synchronize());
          EXPECT_EQ(snapshot(), before);
          // Every rank still holds the bytes: the retry succeeds and reads back the model.
          ASSERT_OK(call.run(cache));
          ASSERT_OK(cache.synchronize());
          for (SequenceId id : {SequenceId{1}, SequenceId{3}, SequenceId{4}}) {
            if (cache.residency(id).value() == SequenceResidency::kHost) {
              ASSERT_OK(cache.restore(id));
            }
            for (int32_t layer = 0; layer < config.num_layers; ++layer) {
              ASSERT_EQ(gather_all_heads(cache, backends, id, layer),
                        model_layer(cache, tokens.at(id), layer))
                  << "sequence " << id << " layer " << layer;
            }
          }
        }
      }
    }
  EXPECT_GT(failed_calls, 8) << "too few faults reached the calls under test";
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallel,
                         ::testing::Combine(testing::runtime_backends(), ::testing::Values(2, 4),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(backend_label(std::get<0>(info.param))) + "Tp" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "TwoGroups" : "");
                         });

// Where each rank's pools are, what they hold, and the rank checks of the per-rank calls.
TEST(TensorParallelPools, EveryRankHasItsPoolsOfItsHeads) {
  for (const int32_t tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const CacheConfig config = tp_config(BackendKind::kCpu);
    Deployment d = make_deployment(BackendKind::kCpu, config, tp);
    ASSERT_NE(d.cache, nullptr);
    KvCache& cache = *d.cache;
    EXPECT_EQ(cache.shard_config(0).num_kv_heads, config.num_kv_heads / tp);
    EXPECT_EQ(cache.pool_info().device_bytes, config.block_bytes() * config.num_device_blocks);
    const std::vector<PoolRegion> regions = cache.regions();
    ASSERT_EQ(regions.size(), static_cast<size_t>(2 * tp));  // a device and a host pool each
    std::vector<uint64_t> fingerprints;
    for (int32_t r = 0; r < tp; ++r) {
      EXPECT_EQ(cache.device_pool(0, r).layout.num_kv_heads, config.num_kv_heads / tp);
      auto geo = cache.block_geometry(0, Tier::kDevice, "m", r);
      ASSERT_OK(geo);
      EXPECT_EQ(geo->region.rank, r);
      EXPECT_EQ(geo->num_kv_heads, config.num_kv_heads / tp);
      EXPECT_EQ(geo->block_bytes, config.block_bytes() / tp);
      EXPECT_EQ(geo->region.base, reinterpret_cast<uintptr_t>(cache.device_pool(0, r).data));
      fingerprints.push_back(geo->fingerprint);
    }
    // Each rank's blocks hold other heads, and none is an unsharded cache's of that many heads.
    std::sort(fingerprints.begin(), fingerprints.end());
    EXPECT_EQ(std::unique(fingerprints.begin(), fingerprints.end()), fingerprints.end());
    CacheConfig narrow = config;
    narrow.num_kv_heads = config.num_kv_heads / tp;
    auto alone = KvCache::create(narrow);
    ASSERT_OK(alone);
    EXPECT_EQ(std::count(fingerprints.begin(), fingerprints.end(),
                         (*alone)->block_geometry(0, Tier::kDevice, "m")->fingerprint),
              0);
    // A rank outside the cache.
    EXPECT_EQ(cache.block_geometry(0, Tier::kDevice, "m", tp).status().code(),
              StatusCode::kOutOfRange);
    ASSERT_OK(cache.add_sequence(1, {1, 2, 3}));
    ASSERT_OK(cache.reserve(1, 1));
    DeviceBuffer k(cache.backend(0), 64), v(cache.backend(0), 64);
    EXPECT_EQ(cache.write_kv(1, 0, k.data(), v.data(), DType::kFloat16, 0, tp).code(),
              StatusCode::kOutOfRange);
    EXPECT_EQ(cache.write_kv(1, 0, k.data(), v.data(), DType::kFloat16, 0, -1).code(),
              StatusCode::kOutOfRange);
    auto batch = cache.build_batch({});
    ASSERT_OK(batch);
    EXPECT_EQ(cache.rank_batch(*batch, tp).status().code(), StatusCode::kOutOfRange);
    // Rank 0's arrays under rank 1's name would point rank 1's kernels at rank 0's memory.
    DeviceBatch forged = *batch;
    forged.rank = 1;
    EXPECT_EQ(cache.write_kv_batch(forged, 0, k.data(), v.data(), DType::kFloat16).code(),
              StatusCode::kInvalidArgument);
    EXPECT_OK(cache.write_kv_batch(cache.rank_batch(*batch, 1).value(), 0, k.data(), v.data(),
                                   DType::kFloat16));
    ASSERT_OK(cache.reserve(1, 1));  // the batch is stale now
    EXPECT_EQ(cache.rank_batch(*batch, 0).status().code(), StatusCode::kFailedPrecondition);
    ASSERT_OK(cache.check_invariants());
  }
}

// Each rank's cache work goes on the caller's stream of that rank (rank_native_compute_streams):
// write_kv on rank r reads K/V that a slow kernel queued on rank r's stream filled, as the one-rank
// CallerStreamTest shows for native_compute_stream. On the CPU backend a stream handle is any
// non-null token, and every launch lags the host.
TEST(TensorParallelStreams, EachRanksWorkIsQueuedOnItsCallersStream) {
  constexpr int32_t kTp = 2;
  CpuBackendOptions slow;
  slow.kernel_delay = std::chrono::microseconds(20000);
  slow.run_inline_when_idle = false;
  std::vector<std::unique_ptr<Backend>> backends;
  int tokens[kTp] = {0, 0};
  KvCacheOptions o;
  o.tp_size = kTp;
  for (int32_t r = 0; r < kTp; ++r) {
    backends.push_back(create_cpu_backend(slow));
    o.rank_backends.push_back(backends.back().get());
    o.rank_native_compute_streams.push_back(&tokens[r]);
  }
  CacheConfig c = tp_config(BackendKind::kCpu);
  c.num_layers = 1;
  auto made = KvCache::create(c, o);
  ASSERT_OK(made);
  KvCache& kv = **made;
  const int64_t n = 5;
  const int64_t row = int64_t{c.num_kv_heads / kTp} * c.head_dim;
  ASSERT_OK(kv.add_sequence(1, {}));
  ASSERT_OK(kv.reserve(1, n));
  for (int32_t r = 0; r < kTp; ++r) {
    Backend& be = kv.backend(r);
    ASSERT_EQ(be.native_stream(kv.compute_stream(r)).value(), static_cast<void*>(&tokens[r]));
    DeviceBuffer k(be, size_t(n * row) * 2), v(be, k.bytes());
    k.upload(std::vector<uint16_t>(size_t(n * row), 0));
    v.upload(std::vector<uint16_t>(size_t(n * row), 0));
    // The model's work on rank r's stream: busy, then a fill of K and V with fp16 (r + 1)s. A
    // write_kv not ordered after it would read the zeros.
    ASSERT_OK(testing::launch_spin(be, kv.compute_stream(r), 50'000'000));
    const uint16_t half = r == 0 ? 0x3c00 : 0x4000;  // 1.0, 2.0
    for (void* dst : {k.data(), v.data()}) {
      kernels::FillBody fill{static_cast<uint32_t*>(dst), (uint32_t{half} << 16) | half};
      KernelLaunch l;
      l.kernel = KernelId::kFill;
      l.params = &fill;
      l.params_size = sizeof(fill);
      l.num_items = n * row / 2;
      ASSERT_OK(be.launch(l, kv.compute_stream(r)));
    }
    ASSERT_OK(kv.write_kv(1, 0, k.data(), v.data(), DType::kFloat16, 0, r));
    ASSERT_OK(kv.synchronize());  // the buffers go at the end of this iteration
  }
  ASSERT_OK(kv.commit(1, std::vector<TokenId>(size_t(n), 3)));
  for (int32_t r = 0; r < kTp; ++r) {
    DeviceBuffer gk(kv.backend(r), size_t(n * row) * 2), gv(kv.backend(r), gk.bytes());
    ASSERT_OK(kv.gather_layer(1, 0, gk.data(), gv.data(), DType::kFloat16,
                              PackedLayout::kTokenMajor, 0, -1, r));
    ASSERT_OK(kv.synchronize());
    const uint16_t half = r == 0 ? 0x3c00 : 0x4000;
    EXPECT_EQ(gk.download<uint16_t>(), std::vector<uint16_t>(size_t(n * row), half)) << r;
    EXPECT_EQ(gv.download<uint16_t>(), std::vector<uint16_t>(size_t(n * row), half)) << r;
  }
}

// What a TP cache refuses, each with the field it names.
TEST(TensorParallelConfig, RefusesWhatCannotBeSharded) {
  CacheConfig c = tp_config(BackendKind::kCpu);
  struct Case {
    const char* name;
    std::function<void(CacheConfig*, KvCacheOptions*)> set;
    StatusCode code;
    const char* names;
  };
  testing::NullStorage store, other_store;
  std::unique_ptr<Backend> one = create_cpu_backend();
  const std::vector<Case> cases = {
      {"tp_size 0", [](CacheConfig*, KvCacheOptions* o) { o->tp_size = 0; },
       StatusCode::kInvalidArgument, "tp_size"},
      {"heads that do not split", [](CacheConfig*, KvCacheOptions* o) { o->tp_size = 3; },
       StatusCode::kInvalidArgument, "do not split"},
      {"one backend for several ranks",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->backend = one.get();
       },
       StatusCode::kInvalidArgument, "rank_backends"},
      {"rank backends of another count",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_backends = {one.get()};
       },
       StatusCode::kInvalidArgument, "rank_backends"},
      {"a null rank backend",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_backends = {one.get(), nullptr};
       },
       StatusCode::kInvalidArgument, "null"},
      {"one rank's compute stream",
       [](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->native_compute_stream = reinterpret_cast<void*>(1);
       },
       StatusCode::kInvalidArgument, "rank_native_compute_streams"},
      {"rank streams of another count",
       [](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_native_compute_streams = {reinterpret_cast<void*>(1)};
       },
       StatusCode::kInvalidArgument, "rank_native_compute_streams"},
      {"a null rank stream",
       [](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_native_compute_streams = {reinterpret_cast<void*>(1), nullptr};
       },
       StatusCode::kInvalidArgument, "null"},
      {"rank streams without tensor parallelism",
       [](CacheConfig*, KvCacheOptions* o) {
         o->rank_native_compute_streams = {reinterpret_cast<void*>(1)};
       },
       StatusCode::kInvalidArgument, "rank_native_compute_streams"},
      {"one store for every rank",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->storage = &store;
       },
       StatusCode::kInvalidArgument, "rank_storage"},
      {"rank stores of another count",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_storage = {&store};
       },
       StatusCode::kInvalidArgument, "rank_storage"},
      {"rank stores without tensor parallelism",
       [&](CacheConfig*, KvCacheOptions* o) { o->rank_storage = {&store}; },
       StatusCode::kInvalidArgument, "rank_storage"},
      {"the owner's store on one rank only",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_storage = {&store, nullptr};
       },
       StatusCode::kInvalidArgument, "every rank"},
      {"a store whose layout is not the rank's",
       [&](CacheConfig*, KvCacheOptions* o) {
         o->tp_size = 2;
         o->rank_storage = {&store, &other_store};
       },
       StatusCode::kInvalidArgument, "layout"},
  };
  for (const Case& k : cases) {
    CacheConfig config = c;
    KvCacheOptions o;
    k.set(&config, &o);
    auto made = KvCache::create(config, o);
    EXPECT_EQ(made.status().code(), k.code) << k.name << ": " << made.status().to_string();
    EXPECT_NE(made.status().message().find(k.names), std::string::npos)
        << k.name << ": " << made.status().to_string();
  }
}

// An MLA latent group is whole on every rank; a K/V group beside it is split.
TEST(TensorParallelConfig, ALatentGroupIsReplicatedAndAKvGroupSplit) {
  CacheConfig latent = tp_config(BackendKind::kCpu);
  latent.kv_kind = KvKind::kLatent;
  latent.num_kv_heads = 1;
  latent.head_dim = 37;
  latent.rope_dim = 5;
  KvCacheOptions o;
  o.tp_size = 2;
  auto lat = KvCache::create(latent, o);
  ASSERT_OK(lat);
  EXPECT_EQ((*lat)->shard_config(0).num_kv_heads, 1);
  EXPECT_EQ((*lat)->device_pool(0, 1).layout.head_dim, (*lat)->device_pool(0, 0).layout.head_dim);
  EXPECT_EQ((*lat)->pool_info().device_bytes, 2 * latent.block_bytes() * latent.num_device_blocks);

  // Beside a K/V group of 4 heads (layers 0, 2) in one cache: the K/V group splits, the latent
  // group (layer 1) does not.
  CacheConfig mixed = tp_config(BackendKind::kCpu);
  mixed.num_layers = 3;
  KvGroup mla = KvGroup::latent("mla", {1}, 37, 5);
  mla.num_device_blocks = 16;
  mixed.groups = {kv_group("full", {0, 2}, 4, 8, 0, 16, 0), mla};
  auto both = KvCache::create(mixed, o);
  ASSERT_OK(both);
  EXPECT_EQ((*both)->shard_config(0).num_kv_heads, 2);
  EXPECT_EQ((*both)->shard_config(1).num_kv_heads, 1);
  EXPECT_EQ((*both)->shard_config(1).head_dim, 37);
  ASSERT_OK((*both)->add_sequence(1, {1, 2, 3, 4, 5}));
  ASSERT_OK((*both)->reserve(1, 5));
  for (int32_t r = 0; r < 2; ++r) {
    // Rank r writes its 2 of the K/V group's heads and the whole latent.
    DeviceBuffer rows((*both)->backend(r), 5 * 37 * 2);
    EXPECT_OK((*both)->write_kv(1, 0, rows.data(), rows.data(), DType::kFloat16, 0, r));
    EXPECT_OK((*both)->write_kv(1, 1, rows.data(), nullptr, DType::kFloat16, 0, r));
  }
  ASSERT_OK((*both)->synchronize());
  ASSERT_OK((*both)->check_invariants());
}

}  // namespace
}  // namespace pagedkv

namespace pagedkv {
namespace {

class TensorParallelStorage : public ::testing::TestWithParam<int32_t> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pagedkv-tp-storage-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::unique_ptr<StorageTier> file_tier(const std::string& name, const StorageLayout& layout) {
    FileTierOptions fo;
    fo.directory = dir_ + "/" + name;
    auto store = make_file_tier(layout, fo);
    EXPECT_OK(store);
    return store.ok() ? std::move(store).value() : nullptr;
  }
  std::string dir_;
};

// A step's events as (kind, tier, block hash, sequence), sorted.
std::vector<std::tuple<int, int, uint64_t, SequenceId>> event_set(
    const std::vector<ControlEvent>& events) {
  std::vector<std::tuple<int, int, uint64_t, SequenceId>> out;
  for (const ControlEvent& e : events) {
    out.emplace_back(static_cast<int>(e.kind), static_cast<int>(e.tier), e.block_hash, e.sequence);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Flushes both caches' storage (every write-back stored and announced, every fetch landed).
void flush_both(KvCache& a, KvCache& b) {
  ASSERT_OK(a.flush_storage());
  ASSERT_OK(b.flush_storage());
}

TEST_P(TensorParallelStorage, EveryRankWritesBackAndFetchesItsHeadsAsTheUnshardedCacheDoes) {
  const int32_t tp = GetParam();
  CacheConfig config = tp_config(BackendKind::kCpu);
  config.num_device_blocks = 10;  // a few prompts fill it: cached blocks go to the host and on
  config.num_host_blocks = 6;
  const CacheConfig part = rank_config(config, tp).value();
  std::unique_ptr<StorageTier> ref_store =
      file_tier("one", StorageLayout::from_config(config, "tp-model"));
  std::vector<std::unique_ptr<StorageTier>> stores;
  std::vector<StorageTier*> rank_storage;
  for (int32_t r = 0; r < tp; ++r) {
    stores.push_back(
        file_tier("rank" + std::to_string(r), StorageLayout::for_rank(part, "tp-model", tp, r)));
    ASSERT_NE(stores.back(), nullptr);
    rank_storage.push_back(stores.back().get());
  }
  ASSERT_NE(ref_store, nullptr);
  // The stores' layouts name the TP size and the rank: none serves another deployment.
  EXPECT_NE(rank_storage[0]->layout().fingerprint(), ref_store->layout().fingerprint());
  EXPECT_NE(rank_storage[0]->layout().fingerprint(), rank_storage[1]->layout().fingerprint());
  {
    std::vector<StorageTier*> swapped = rank_storage;
    std::swap(swapped[0], swapped[1]);
    KvCacheOptions o;
    o.tp_size = tp;
    o.rank_storage = swapped;
    EXPECT_EQ(KvCache::create(config, o).status().code(), StatusCode::kInvalidArgument);
  }

  std::mt19937 rng(static_cast<uint32_t>(40 + tp));
  const std::vector<TokenId> system = {11, 12, 13, 14, 15, 16, 17, 18};
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<TokenId> p = system;
    for (int t = 0; t < 5 + i; ++t) p.push_back(100 + 10 * i + t);
    prompts.push_back(p);
  }
  int64_t fetched = 0;
  SequenceId next_id = 1;
  for (int pass = 0; pass < 2; ++pass) {  // pass 1: new caches over the same stores (a restart)
    SCOPED_TRACE("pass " + std::to_string(pass));
    std::unique_ptr<Backend> one_backend = create_cpu_backend();
    KvCacheOptions o;
    o.backend = one_backend.get();
    o.storage = ref_store.get();
    auto made = KvCache::create(config, o);
    ASSERT_OK(made);
    KvCache& ref = **made;
    Deployment ranks = make_deployment(BackendKind::kCpu, config, tp, false, rank_storage);
    ASSERT_NE(ranks.cache, nullptr);
    KvCache& sharded = *ranks.cache;
    const std::vector<Backend*> ref_backends{one_backend.get()};
    const std::vector<Backend*> tp_backends = backends_of(sharded);
    for (int step = 0; step < 40; ++step) {
      const std::vector<TokenId>& prompt = prompts[rng() % prompts.size()];
      flush_both(ref, sharded);
      StatusOr<int64_t> a = ref.fetch_from_storage(prompt);
      StatusOr<int64_t> b = sharded.fetch_from_storage(prompt);
      ASSERT_OK(a);
      ASSERT_OK(b);
      ASSERT_EQ(*a, *b) << "step " << step;
      fetched += *b;
      flush_both(ref, sharded);
      const SequenceId id = next_id++;
      StatusOr<int64_t> hit = ref.add_sequence(id, prompt);
      ASSERT_OK(hit);
      ASSERT_EQ(sharded.add_sequence(id, prompt).value(), *hit) << "step " << step;
      const std::vector<TokenId> rest(prompt.begin() + *hit, prompt.end());
      ASSERT_OK(ref.reserve(id, static_cast<int64_t>(rest.size())));
      ASSERT_OK(sharded.reserve(id, static_cast<int64_t>(rest.size())));
      write_and_commit(ref, ref_backends, id, rest, *hit);
      write_and_commit(sharded, tp_backends, id, rest, *hit);
      for (int32_t layer = 0; layer < config.num_layers; ++layer) {
        const std::vector<uint16_t> model = model_layer(sharded, prompt, layer);
        ASSERT_EQ(gather_all_heads(sharded, tp_backends, id, layer), model) << "step " << step;
        ASSERT_EQ(gather_all_heads(ref, ref_backends, id, layer), model) << "step " << step;
      }
      // Offloaded, then finished: its blocks are cached on the host, where later offloads
      // push the least recently used out, written back to the stores.
      ASSERT_OK(ref.offload(id));
      ASSERT_OK(sharded.offload(id));
      ASSERT_OK(ref.finish(id));
      ASSERT_OK(sharded.finish(id));
      flush_both(ref, sharded);
      EXPECT_EQ(ref.stats(), sharded.stats()) << "step " << step;
      // The same events: a put's STORAGE event comes when the store's thread finishes it, so
      // its place among a step's events is the store's timing; compared as a set per step.
      EXPECT_EQ(event_set(ref.drain_events()), event_set(sharded.drain_events()))
          << "step " << step;
      ASSERT_OK(sharded.check_invariants());
    }
    EXPECT_GT(sharded.stats().storage_blocks_written, 0);
    EXPECT_GT(sharded.stats().storage_hit_blocks, 0);
  }
  EXPECT_GT(fetched, 0) << "no prompt came back from the stores";
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelStorage, ::testing::Values(2, 4),
                         [](const auto& info) { return "Tp" + std::to_string(info.param); });

}  // namespace
}  // namespace pagedkv
