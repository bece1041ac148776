// Control-plane benchmarks: a decode step over many sequences, prefix matching, and eviction
// under pressure at growing cache sizes (the cost per eviction must stay flat).
#include <benchmark/benchmark.h>

#include <memory>
#include <numeric>
#include <vector>

#include "core/control_plane.hpp"

namespace pagedkv {
namespace core {
namespace {

std::unique_ptr<ControlPlane> make(int64_t device_blocks, int32_t block_size, bool caching) {
  CacheConfig c;
  c.block_size = block_size;
  c.num_device_blocks = device_blocks;
  c.enable_prefix_caching = caching;
  c.max_sequence_length = 1 << 20;
  ControlOptions o;
  o.enable_events = false;  // measure decisions, not event allocations
  return std::move(ControlPlane::create(c, o)).value();
}

std::vector<TokenId> tokens(int64_t n, TokenId start) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// One decode step of `seqs` running sequences: reserve one slot each (into a reused result), build
// the slot mapping and block tables, commit the sampled token (completed blocks enter the prefix
// index).
void BM_DecodeStep(benchmark::State& state) {
  const int64_t seqs = state.range(0);
  constexpr int32_t kBs = 16;
  constexpr int64_t kPrompt = 100;
  constexpr int64_t kSteps = 256;  // then roll back, so memory stays bounded
  auto cp = make(seqs * ((kPrompt + kSteps) / kBs + 2), kBs, true);
  std::vector<SequenceId> ids;
  for (int64_t s = 0; s < seqs; ++s) {
    const auto p = tokens(kPrompt, static_cast<TokenId>(s * 1000));
    (void)cp->add_sequence(static_cast<SequenceId>(s), p).value();
    (void)cp->reserve(static_cast<SequenceId>(s), kPrompt).value();
    (void)cp->commit(static_cast<SequenceId>(s), p);
    ids.push_back(static_cast<SequenceId>(s));
  }
  (void)cp->set_active(ids);
  int64_t step = 0;
  const TokenId next = 7;
  ReserveResult rr;  // caller-owned, reused every step
  for (auto _ : state) {
    rr.slots.clear();
    rr.transfers = Transfers();
    for (SequenceId id : ids) {
      const Status st = cp->reserve_into(id, 1, &rr);
      benchmark::DoNotOptimize(st);
    }
    auto md = cp->build_batch(ids);
    benchmark::DoNotOptimize(md);
    for (SequenceId id : ids) (void)cp->commit(id, &next, 1);
    if (++step == kSteps) {
      state.PauseTiming();
      for (SequenceId id : ids) (void)cp->rollback(id, kPrompt);
      step = 0;
      state.ResumeTiming();
    }
  }
  state.counters["per_seq"] =
      benchmark::Counter(static_cast<double>(seqs), benchmark::Counter::kIsIterationInvariantRate |
                                                        benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeStep)->RangeMultiplier(4)->Range(64, 4096)->Unit(benchmark::kMicrosecond);

// Longest-prefix match of a fully cached prompt (add + finish of a sequence that reuses it).
void BM_PrefixMatch(benchmark::State& state) {
  const int64_t len = state.range(0);
  constexpr int32_t kBs = 16;
  auto cp = make(len / kBs + 64, kBs, true);
  const auto p = tokens(len, 1);
  (void)cp->add_sequence(0, p).value();
  (void)cp->reserve(0, len).value();
  (void)cp->commit(0, p);
  SequenceId id = 1;
  for (auto _ : state) {
    auto c = cp->add_sequence(id, p);
    benchmark::DoNotOptimize(c);
    (void)cp->finish(id);
    ++id;
  }
  state.SetItemsProcessed(state.iterations() * len);
  state.SetLabel("items = tokens matched");
}
BENCHMARK(BM_PrefixMatch)->RangeMultiplier(8)->Range(128, 32768);

// A full cache of `cached` unreferenced blocks; each iteration a new one-block sequence
// evicts the LRU leaf, computes its block (which becomes cached) and finishes.
void BM_EvictUnderPressure(benchmark::State& state) {
  const int64_t cached = state.range(0);
  constexpr int32_t kBs = 16;
  constexpr int64_t kChain = 64;  // blocks per warm-up prompt
  auto cp = make(cached, kBs, true);
  SequenceId id = 0;
  TokenId tok = 0;
  for (int64_t b = 0; b < cached; b += kChain) {
    const int64_t n = std::min<int64_t>(kChain, cached - b) * kBs;
    const auto p = tokens(n, tok);
    tok += static_cast<TokenId>(n);
    (void)cp->add_sequence(id, p).value();
    (void)cp->reserve(id, n).value();
    (void)cp->commit(id, p);
    (void)cp->finish(id++);
  }
  const int64_t evicted_before = cp->stats().blocks_evicted;
  for (auto _ : state) {
    const auto p = tokens(kBs, tok);
    tok += kBs;
    (void)cp->add_sequence(id, {}).value();
    auto r = cp->reserve(id, kBs);
    benchmark::DoNotOptimize(r);
    (void)cp->commit(id, p);
    (void)cp->finish(id++);
  }
  const int64_t evictions = cp->stats().blocks_evicted - evicted_before;
  state.counters["evictions"] = static_cast<double>(evictions);
  state.counters["per_eviction"] = benchmark::Counter(
      1.0, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_EvictUnderPressure)->RangeMultiplier(32)->Range(1 << 10, 1 << 20);

}  // namespace
}  // namespace core
}  // namespace pagedkv

BENCHMARK_MAIN();
