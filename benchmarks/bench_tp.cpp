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

#include "benchmarks/decode_steps.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlock = 16;
constexpr int64_t kPrompt = 100;
constexpr int64_t kSteps = 256;  // then back to the prompt, so memory stays bounded

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
  if (!cache.ok() || !bench::add_decoding_sequences(**cache, seqs, prompt)) return nullptr;
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
  KvCache* caches[2] = {one.get(), many.get()};
  bench::StepTimes t =
      bench::time_decode_steps(state, caches, seqs, kSteps, /*fresh_tokens=*/false, prompt);
  for (KvCache* c : caches) t.failed |= !c->synchronize().ok();
  if (t.failed) {
    state.SkipWithError("a call failed");
    return;
  }
  state.counters["ns_per_seq"] = bench::StepTimes::per_sequence(t.step_ns[1], state, seqs);
  state.counters["one_rank_ns_per_seq"] = bench::StepTimes::per_sequence(t.step_ns[0], state, seqs);
  state.counters["vs_one_rank"] = t.step_ratio();
  state.counters["with_commit_vs_one_rank"] = t.with_commit_ratio();
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
