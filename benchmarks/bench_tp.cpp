// The decode step of a tensor-parallel cache (KvCacheOptions::tp_size) through the public KvCache
// API against the same step of a one-rank cache in the same run, stepped alternately on the same
// sequences: reserve_batch + build_batch, then commit_batch, at 1,024 sequences. One control
// plane decides once for every rank; what grows with the ranks is the fan-out (each rank's
// batch upload, its ordering checks, its part of every tier move). The model is tiny (one layer
// of 8-wide heads, one per rank, each rank on its own CPU backend), so that only the host work of
// the step is timed, not K/V bytes.
//
// Every 256 steps the sequences go back to their prompts (untimed), as in pagedkv_bench_model.
//
// Time is the TP cache's reserve_batch + build_batch (manual time). Counters (ns a sequence,
// thread CPU time less the clock's own cost): ns_per_seq (the same), one_rank_ns_per_seq,
// vs_one_rank (their ratio; goal <= 1.5 at 4 ranks), with_commit_vs_one_rank (the ratio over
// the whole control part of the step, commit_batch included).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "benchmarks/cpu_time.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlock = 16;
constexpr int64_t kPrompt = 100;
constexpr int64_t kSteps = 256;  // then back to the prompt, so memory stays bounded

using bench::cpu_interval_ns;
using bench::cpu_now_ns;

std::vector<TokenId> prompt(SequenceId s) {
  std::vector<TokenId> t(static_cast<size_t>(kPrompt + static_cast<int64_t>(s % kBlock)));
  std::iota(t.begin(), t.end(), static_cast<TokenId>(s * 1000));
  return t;
}

// A cache of `seqs` decoding sequences over `tp` ranks (each on its own CPU backend, in
// `backends`), with room for every sequence at its longest.
std::unique_ptr<KvCache> make_cache(int64_t seqs, int32_t tp,
                                    std::vector<std::unique_ptr<Backend>>* backends) {
  CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = tp;  // one head per rank, whatever the rank count
  c.head_dim = 8;
  c.block_size = kBlock;
  c.num_device_blocks = seqs * ((kPrompt + kBlock + kSteps) / kBlock + 2);
  c.backend = BackendKind::kCpu;
  KvCacheOptions o;
  o.enable_events = false;  // as pagedkv_bench_control: decisions, not event records
  o.tp_size = tp;
  for (int32_t r = 0; r < tp; ++r) {
    backends->push_back(create_cpu_backend());
    o.rank_backends.push_back(backends->back().get());
  }
  auto cache = KvCache::create(c, o);
  if (!cache.ok()) return nullptr;
  std::vector<SequenceId> ids;
  for (SequenceId s = 0; s < static_cast<SequenceId>(seqs); ++s) {
    const auto p = prompt(s);
    if (!(*cache)->add_sequence(s, p).ok() ||
        !(*cache)->reserve(s, static_cast<int64_t>(p.size())).ok() ||
        !(*cache)->commit(s, p).ok()) {
      return nullptr;
    }
    ids.push_back(s);
  }
  if (!(*cache)->set_active(ids).ok()) return nullptr;
  return std::move(*cache);
}

void BM_TpDecodeStep(benchmark::State& state) {
  const int64_t seqs = state.range(0);
  const auto tp = static_cast<int32_t>(state.range(1));
  std::vector<std::unique_ptr<Backend>> backends;  // outlive the caches
  auto one = make_cache(seqs, 1, &backends);
  auto many = make_cache(seqs, tp, &backends);
  if (one == nullptr || many == nullptr) {
    state.SkipWithError("could not set up the caches");
    return;
  }
  std::vector<SequenceId> ids(static_cast<size_t>(seqs));
  std::iota(ids.begin(), ids.end(), SequenceId{0});
  const std::vector<TokenId> sampled(ids.size(), 7);
  KvCache* caches[2] = {one.get(), many.get()};
  int64_t step_ns[2] = {0, 0}, commit_ns[2] = {0, 0};
  int64_t step = 0;
  int64_t iteration = 0;
  bool failed = false;
  for (auto _ : state) {
    for (int turn = 0; turn < 2; ++turn) {  // the caches take turns going first
      const int m = (turn + static_cast<int>(iteration & 1)) % 2;
      const int64_t t0 = cpu_now_ns();
      failed |= !caches[m]->reserve_batch_into(ids, 1, nullptr).ok();
      failed |= !caches[m]->build_batch(ids).ok();
      const int64_t t1 = cpu_now_ns();
      failed |= !caches[m]->commit_batch(ids, sampled, 1).ok();
      const int64_t t2 = cpu_now_ns();
      step_ns[m] += cpu_interval_ns(t0, t1);
      commit_ns[m] += cpu_interval_ns(t1, t2);
      if (m == 1) state.SetIterationTime(static_cast<double>(cpu_interval_ns(t0, t1)) * 1e-9);
    }
    ++iteration;
    if (++step == kSteps) {
      for (SequenceId id : ids) {  // back to the prompt, untimed
        const auto p = prompt(id);
        for (KvCache* c : caches) {
          failed |= !c->rollback(id, 0).ok();
          failed |= !c->reserve(id, static_cast<int64_t>(p.size())).ok();
          failed |= !c->commit(id, p).ok();
        }
      }
      step = 0;
    }
  }
  for (KvCache* c : caches) failed |= !c->synchronize().ok();
  if (failed) {
    state.SkipWithError("a call failed");
    return;
  }
  const double n = static_cast<double>(state.iterations() * seqs);
  const auto ratio = [](int64_t a, int64_t b) {
    return static_cast<double>(a) / static_cast<double>(std::max<int64_t>(b, 1));
  };
  state.counters["ns_per_seq"] = static_cast<double>(step_ns[1]) / n;
  state.counters["one_rank_ns_per_seq"] = static_cast<double>(step_ns[0]) / n;
  state.counters["vs_one_rank"] = ratio(step_ns[1], step_ns[0]);
  state.counters["with_commit_vs_one_rank"] =
      ratio(step_ns[1] + commit_ns[1], step_ns[0] + commit_ns[0]);
  state.SetLabel(std::to_string(tp) + " ranks");
}
BENCHMARK(BM_TpDecodeStep)
    ->Args({1024, 2})
    ->Args({1024, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
