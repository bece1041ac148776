// Decisions that never depend on copy timing (docs/events.md, "Determinism"): the replicas of a
// tensor-parallel group each run a KvCache and must place, evict, demote, offload and announce
// the same blocks. Two caches are driven by the same 10,000-op randomized call sequence under
// pressure in both tiers, one on an instant CPU backend, one whose copies and kernels lag by
// fixed and random delays; after every op their results, event streams (byte for byte), block
// locations, evicted sequences and stats must be identical.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv_workload.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "support/forwarding_backend.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr int64_t kOps = 10000;

// A CPU backend whose streams stall for a random time before some copies and launches: the
// stall is queued on the same stream (a host function that sleeps), so the caller never waits
// for it, but everything behind it on that stream finishes later.
class JitterBackend final : public testing::ForwardingBackend {
 public:
  JitterBackend(std::unique_ptr<Backend> inner, uint64_t seed)
      : ForwardingBackend(std::move(inner)), rng_(seed) {}
  int64_t stalls() const { return stalls_; }

  std::string description() const override { return "jitter over " + inner().description(); }

 private:
  Status before_work(Stream s) override {
    if (rng_() % 3 != 0) return ok_status();
    const auto us = std::chrono::microseconds(1 + rng_() % 60);
    ++stalls_;
    return inner().launch_host_func(s, [us] { std::this_thread::sleep_for(us); });
  }
  std::mt19937_64 rng_;
  int64_t stalls_ = 0;
};

// The soak workload's tiny pools (tools/soak): tiers and pressure within a few operations.
using soak::pressure_config;

// Every field of every event, in a fixed byte layout: two streams are equal when these are.
void append_events(const std::vector<ControlEvent>& events, std::string* out) {
  auto put = [out](const void* p, size_t n) { out->append(static_cast<const char*>(p), n); };
  for (const ControlEvent& e : events) {
    const uint8_t kind = static_cast<uint8_t>(e.kind), tier = static_cast<uint8_t>(e.tier);
    const uint64_t n = e.tokens.size();
    put(&kind, 1);
    put(&tier, 1);
    put(&e.sequence, 8);
    put(&e.block_hash, 8);
    put(&e.parent_hash, 8);
    put(&e.ns, 8);
    put(&n, 8);
    put(e.tokens.data(), n * sizeof(TokenId));
    put(&e.dropped_events, 8);
  }
}

// One cache and the device buffers its write_kv calls read.
struct Replica {
  std::unique_ptr<Backend> backend;
  JitterBackend* jitter = nullptr;
  std::unique_ptr<KvCache> kv;
  void* k = nullptr;
  void* v = nullptr;
  std::string events;  // the whole event stream so far
  int64_t num_events = 0;

  Replica(bool delayed, uint64_t jitter_seed) {
    if (delayed) {
      CpuBackendOptions o;
      o.copy_delay = std::chrono::microseconds(20);
      o.kernel_delay = std::chrono::microseconds(5);
      o.run_inline_when_idle = false;
      auto j = std::make_unique<JitterBackend>(create_cpu_backend(o), jitter_seed);
      jitter = j.get();
      backend = std::move(j);
    } else {
      backend = create_cpu_backend();
    }
    KvCacheOptions options;
    options.backend = backend.get();
    auto c = KvCache::create(pressure_config(), options);
    EXPECT_OK(c);
    kv = std::move(*c);
    const CacheConfig cfg = pressure_config();
    const size_t bytes = size_t{2} * cfg.max_sequence_length * cfg.num_kv_heads * cfg.head_dim * 4;
    k = *backend->allocate_device(bytes);
    v = *backend->allocate_device(bytes);
    std::memset(k, 0x3c, bytes);  // fp16 1.0-ish: the bytes do not matter here, only decisions
    std::memset(v, 0x3d, bytes);
  }
  ~Replica() {
    kv.reset();
    backend->free_device(k);
    backend->free_device(v);
  }
};

// A status as a comparable string ("" for ok).
std::string str(const Status& s) { return s.ok() ? std::string() : s.to_string(); }

class Lockstep {
 public:
  explicit Lockstep(uint64_t seed) : rng_(seed), a_(false, 0), b_(true, seed * 7 + 1) {}

  // One random op on both replicas; false (with a failure recorded) when they disagree.
  bool step(int64_t index) {
    op_ = "op " + std::to_string(index);
    const int r = static_cast<int>(rng_() % 100);
    if (live_.size() < 3 || r < 22) {
      add();
    } else if (r < 40) {
      extend(pick());
    } else if (r < 50) {
      decode_batch();
    } else if (r < 55) {
      both_status("rollback", [&](KvCache& kv, SequenceId id) {
        auto len = kv.length(id);
        return len.ok() ? kv.rollback(id, *len - static_cast<int64_t>(rng_copy_ % 5))
                        : len.status();
      });
    } else if (r < 59) {
      const SequenceId child = next_id_++;
      const SequenceId parent = live_[pick()];
      if (same("fork", a_.kv->fork(parent, child), b_.kv->fork(parent, child)) &&
          a_.kv->contains(child)) {
        live_.push_back(child);
      }
    } else if (r < 68) {
      remove(pick(), /*finish=*/true);
    } else if (r < 72) {
      remove(pick(), /*finish=*/false);
    } else if (r < 80) {
      const SequenceId id = live_[pick()];
      same("offload", a_.kv->offload(id), b_.kv->offload(id));
    } else if (r < 86) {
      const SequenceId id = live_[pick()];
      same("restore", a_.kv->restore(id), b_.kv->restore(id));
    } else if (r < 90) {
      std::vector<SequenceId> ids = {live_[pick()], live_[pick()]};
      if (ids[0] == ids[1]) ids.pop_back();
      same("prefetch", a_.kv->prefetch(ids), b_.kv->prefetch(ids));
    } else if (r < 95) {
      std::vector<SequenceId> ids;
      for (SequenceId id : live_) {
        if (rng_() % 4 == 0) ids.push_back(id);
      }
      same("set_active", a_.kv->set_active(ids), b_.kv->set_active(ids));
    } else {
      const SequenceId id = live_[pick()];
      const auto p = static_cast<int32_t>(rng_() % 5);
      same("set_priority", a_.kv->set_priority(id, p), b_.kv->set_priority(id, p));
    }
    return compare_state();
  }

  bool failed() const { return failed_; }
  Replica& a() { return a_; }
  Replica& b() { return b_; }

 private:
  size_t pick() { return static_cast<size_t>(rng_() % live_.size()); }

  bool same(const char* call, const Status& x, const Status& y) {
    if (str(x) != str(y)) {
      fail(std::string(call) + ": instant '" + str(x) + "' vs delayed '" + str(y) + "'");
      return false;
    }
    return x.ok();
  }
  template <typename T>
  bool same_value(const char* call, const StatusOr<T>& x, const StatusOr<T>& y) {
    if (!same(call, x.status(), y.status())) return false;
    if (*x != *y) {
      fail(std::string(call) + ": results differ");
      return false;
    }
    return true;
  }
  template <typename F>
  void both_status(const char* call, F f) {
    const SequenceId id = live_[pick()];
    rng_copy_ = rng_();
    same(call, f(*a_.kv, id), f(*b_.kv, id));
  }

  void fail(const std::string& what) {
    if (!failed_) ADD_FAILURE() << op_ << ": " << what;
    failed_ = true;
  }

  std::vector<TokenId> random_tokens(size_t n) {
    std::vector<TokenId> t(n);
    for (auto& x : t) x = static_cast<TokenId>(rng_() % 32000);
    return t;
  }

  // Reserve, write every layer, commit: the step of one sequence, on both replicas.
  bool write(SequenceId id, const std::vector<TokenId>& tokens) {
    const auto n = static_cast<int64_t>(tokens.size());
    if (!same_value("reserve", a_.kv->reserve(id, n), b_.kv->reserve(id, n))) return false;
    for (int32_t l = 0; l < pressure_config().num_layers; ++l) {
      if (!same("write_kv", a_.kv->write_kv(id, l, a_.k, a_.v, DType::kFloat16),
                b_.kv->write_kv(id, l, b_.k, b_.v, DType::kFloat16))) {
        return false;
      }
    }
    return same("commit", a_.kv->commit(id, tokens), b_.kv->commit(id, tokens));
  }

  void add() {
    std::vector<TokenId> prompt;
    const size_t shared = rng_() % 5;  // 4 shared prefixes of 8 tokens, or none
    if (shared < 4) {
      for (TokenId i = 0; i < 8; ++i) prompt.push_back(static_cast<TokenId>(1000 * shared) + i);
    }
    const std::vector<TokenId> tail = random_tokens(1 + rng_() % 24);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    SequenceOptions o;
    o.ns = rng_() % 6 == 0 ? 9 : 0;
    o.priority = static_cast<int32_t>(rng_() % 3);
    o.retention_priority = static_cast<int32_t>(rng_() % 101);
    const SequenceId id = next_id_++;
    auto x = a_.kv->add_sequence(id, prompt, o);
    auto y = b_.kv->add_sequence(id, prompt, o);
    if (!same_value("add_sequence", x, y)) return;
    live_.push_back(id);
    const std::vector<TokenId> rest(prompt.begin() + *x, prompt.end());
    if (!write(id, rest)) remove(live_.size() - 1, /*finish=*/false);
  }

  void extend(size_t i) { write(live_[i], random_tokens(1 + rng_() % 3)); }

  // A decode step of a few sequences through the batched calls.
  void decode_batch() {
    std::vector<SequenceId> ids;
    for (SequenceId id : live_) {
      if (ids.size() < 4 && rng_() % 2 == 0) ids.push_back(id);
    }
    if (ids.empty()) return;
    if (!same_value("reserve_batch", a_.kv->reserve_batch(ids, 1), b_.kv->reserve_batch(ids, 1))) {
      return;
    }
    auto x = a_.kv->build_batch(ids);
    auto y = b_.kv->build_batch(ids);
    if (!same("build_batch", x.status(), y.status())) return;
    for (int32_t l = 0; l < pressure_config().num_layers; ++l) {
      if (!same("write_kv_batch", a_.kv->write_kv_batch(*x, l, a_.k, a_.v, DType::kFloat16),
                b_.kv->write_kv_batch(*y, l, b_.k, b_.v, DType::kFloat16))) {
        return;
      }
    }
    const std::vector<TokenId> t = random_tokens(ids.size());
    same("commit_batch", a_.kv->commit_batch(ids, t), b_.kv->commit_batch(ids, t));
  }

  void remove(size_t i, bool finish) {
    const SequenceId id = live_[i];
    if (finish) {
      same("finish", a_.kv->finish(id), b_.kv->finish(id));
    } else {
      same("erase", a_.kv->erase(id), b_.kv->erase(id));
    }
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  bool compare_state() {
    const std::vector<SequenceId> ea = a_.kv->drain_evicted_sequences();
    if (ea != b_.kv->drain_evicted_sequences()) fail("evicted sequences differ");
    for (SequenceId gone : ea) {
      for (size_t k = 0; k < live_.size(); ++k) {
        if (live_[k] == gone) {
          live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
      }
    }
    const std::vector<ControlEvent> xa = a_.kv->drain_events(), xb = b_.kv->drain_events();
    a_.num_events += static_cast<int64_t>(xa.size());
    b_.num_events += static_cast<int64_t>(xb.size());
    append_events(xa, &a_.events);
    append_events(xb, &b_.events);
    if (a_.events != b_.events) fail("event streams differ");
    const std::string d = testing::stats_diff(testing::named_stats(a_.kv->stats()),
                                              testing::named_stats(b_.kv->stats()));
    if (!d.empty()) fail("stats differ: " + d);
    for (SequenceId id : live_) {
      auto la = a_.kv->block_locations(id);
      auto lb = b_.kv->block_locations(id);
      if (str(la.status()) != str(lb.status()) || (la.ok() && *la != *lb)) {
        fail("block ids of sequence " + std::to_string(id) + " differ");
      }
    }
    const Status ia = a_.kv->check_invariants(), ib = b_.kv->check_invariants();
    if (!ia.ok() || !ib.ok()) fail("invariants: '" + str(ia) + "' / '" + str(ib) + "'");
    return !failed_;
  }

  std::mt19937_64 rng_;
  uint64_t rng_copy_ = 0;
  Replica a_, b_;
  std::vector<SequenceId> live_;
  SequenceId next_id_ = 1;
  std::string op_;
  bool failed_ = false;
};

TEST(Determinism, InstantAndDelayedCopiesMakeIdenticalDecisions) {
  Lockstep run(20261203);
  int64_t ops = 0;
  for (; ops < kOps && run.step(ops); ++ops) {
  }
  EXPECT_EQ(ops, kOps);
  ASSERT_OK(run.a().kv->synchronize());
  ASSERT_OK(run.b().kv->synchronize());
  EXPECT_EQ(run.a().events, run.b().events);  // once more, as a whole
  // The workload reached what makes replicas drift if anything depended on timing.
  const ControlStats s = run.a().kv->stats();
  EXPECT_GT(s.blocks_demoted, 0);
  EXPECT_GT(s.host_blocks_dropped, 0);
  EXPECT_GT(s.blocks_offloaded, 0);
  EXPECT_GT(s.blocks_restored, 0);
  EXPECT_GT(s.copy_on_write, 0);
  EXPECT_GT(s.sequences_evicted + s.blocks_evicted, 0);
  EXPECT_GT(s.prefix_host_hit_blocks, 0);
  EXPECT_GT(run.a().num_events, 10000);
  EXPECT_GT(run.b().jitter->stalls(), 1000);
  std::printf(
      "determinism: %lld ops, %lld events (%zu bytes) identical; demoted %lld, host drops "
      "%lld, offloaded %lld, restored %lld, copy-on-write %lld, stalls injected %lld\n",
      static_cast<long long>(ops), static_cast<long long>(run.a().num_events),
      run.a().events.size(), static_cast<long long>(s.blocks_demoted),
      static_cast<long long>(s.host_blocks_dropped), static_cast<long long>(s.blocks_offloaded),
      static_cast<long long>(s.blocks_restored), static_cast<long long>(s.copy_on_write),
      static_cast<long long>(run.b().jitter->stalls()));
}

TEST(Determinism, TheComparisonSeesADifferentDecision) {
  // The check can fail: one extra call on one replica changes what the other sees.
  Lockstep run(7);
  for (int64_t i = 0; i < 50; ++i) ASSERT_TRUE(run.step(i));
  std::vector<TokenId> prompt(12, 5);
  ASSERT_OK(run.a().kv->add_sequence(999999, prompt));
  ASSERT_OK(run.a().kv->reserve(999999, 12));
  ASSERT_OK(run.a().kv->commit(999999, prompt));
  EXPECT_NE(testing::stats_diff(testing::named_stats(run.a().kv->stats()),
                                testing::named_stats(run.b().kv->stats())),
            "");
  std::string ea, eb;
  append_events(run.a().kv->drain_events(), &ea);
  append_events(run.b().kv->drain_events(), &eb);
  EXPECT_NE(ea, eb);
}

}  // namespace
}  // namespace pagedkv
