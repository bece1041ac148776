// The decode step of a model through the public ModelKvCache API: the control part of the step
// (reserve_batch + build_batch, then commit_batch) of a model of two KV groups (gpt-oss-like:
// a full-attention group and a window-128 group) against the same step of a one-group model in
// the same run, stepped alternately on the same sequences. This is BM_DecodeStepTwoGroups of
// pagedkv_bench_control one layer up: it adds what the runtime does per group (the tier plan,
// the batch upload, the checks of a model-wide call), so vs_one_group is the ratio a server
// sees for the control part of its step. No data-plane calls: the model is tiny (one layer of
// one 8-wide head per group, CPU backend), so that only the control work is timed.
//
// Every 256 steps the sequences go back to their prompts (untimed). As in
// pagedkv_bench_control, every cycle samples the same tokens, so from the second cycle on a
// full block's key is one the index already holds (the commit takes the cached block and frees
// its own) and only the window group evicts. The third argument 1 samples other tokens each
// cycle instead: every block is a new key, and the full group's pool, which then holds the
// earlier cycles' blocks as cached blocks, evicts one for each new block, as a server's pool
// under load does. The two-group model's groups share the logical blocks of one cache. The two
// models take turns going first.
//
// The fifth argument 1 builds the window group's table as a ring (BatchOptions::
// ring_window_tables: about 9 entries a row for window 128 at block size 16, against the full
// group's width), the form a window-aware attention kernel reads.
//
// Time is the two-group model's reserve_batch + build_batch (manual time). Counters (ns a
// sequence, thread CPU time less the clock's own cost): ns_per_seq (the same),
// one_group_ns_per_seq, vs_one_group (their ratio), commit_ns_per_seq and
// one_group_commit_ns_per_seq (commit_batch alone), with_commit_vs_one_group (the ratio over
// the whole control part of the step).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "benchmarks/decode_steps.hpp"
#include "pagedkv/model_cache.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlock = 16;
constexpr int64_t kPrompt = 100;
constexpr int64_t kSteps = 256;  // then back to the prompt, so memory stays bounded
constexpr int32_t kWindow = 128;

// The prompt length of sequence `s`: 100 tokens, or with `staggered` 100 + s % 16, so that the
// sequences fill a block on different steps.
int64_t prompt_length(SequenceId s, bool staggered) {
  return kPrompt + (staggered ? static_cast<int64_t>(s % kBlock) : 0);
}

std::vector<TokenId> prompt(SequenceId s, bool staggered) {
  std::vector<TokenId> t(static_cast<size_t>(prompt_length(s, staggered)));
  std::iota(t.begin(), t.end(), static_cast<TokenId>(s * 1000));
  return t;
}

KvGroup tiny_group(const char* name, int32_t layer, int32_t window, int64_t blocks) {
  KvGroup g;
  g.name = name;
  g.layers = {layer};
  g.num_kv_heads = 1;
  g.head_dim = 8;
  g.sliding_window = window;
  g.num_device_blocks = blocks;
  return g;
}

// A model of `seqs` decoding sequences: one full group, or a full and a window-128 group. The
// full pool holds every sequence at its longest; the window pool its window and a few blocks
// more, so the window group evicts cached blocks as a tight pool does.
std::unique_ptr<ModelKvCache> make_model(int64_t seqs, bool two_groups, bool staggered,
                                         BackendKind backend) {
  const int64_t longest = prompt_length(kBlock - 1, staggered) + kSteps;
  CacheConfig c;
  c.num_layers = two_groups ? 2 : 1;
  c.block_size = kBlock;
  c.max_sequence_length = 1 << 20;
  c.backend = backend;
  c.groups.push_back(tiny_group("full", 0, 0, seqs * (longest / kBlock + 2)));
  if (two_groups) {
    c.groups.push_back(tiny_group("window", 1, kWindow, seqs * ((kWindow + kPrompt) / kBlock + 3)));
  }
  ModelKvCacheOptions o;
  o.cache.enable_events = false;  // as pagedkv_bench_control: decisions, not event records
  auto model = ModelKvCache::create(c, o);
  if (!model.ok() || !bench::add_decoding_sequences(
                         **model, seqs, [&](SequenceId s) { return prompt(s, staggered); })) {
    return nullptr;
  }
  return std::move(*model);
}

void BM_ModelDecodeStep(benchmark::State& state) {
  const int64_t seqs = state.range(0);
  const bool staggered = state.range(1) != 0;
  const bool fresh_tokens = state.range(2) != 0;
  const BackendKind backend = state.range(3) != 0 ? BackendKind::kNull : BackendKind::kCpu;
  BatchOptions options;
  options.ring_window_tables = state.range(4) != 0;
  auto one = make_model(seqs, false, staggered, backend);
  auto two = make_model(seqs, true, staggered, backend);
  if (one == nullptr || two == nullptr) {
    state.SkipWithError("could not set up the models");
    return;
  }
  ModelKvCache* models[2] = {one.get(), two.get()};
  const bench::StepTimes t = bench::time_decode_steps(
      state, models, seqs, kSteps, fresh_tokens, [&](SequenceId s) { return prompt(s, staggered); },
      options);
  if (t.failed) {
    state.SkipWithError("a call failed");
    return;
  }
  const auto per_seq = [&](int64_t ns) { return bench::StepTimes::per_sequence(ns, state, seqs); };
  state.counters["ns_per_seq"] = per_seq(t.step_ns[1]);
  state.counters["one_group_ns_per_seq"] = per_seq(t.step_ns[0]);
  state.counters["vs_one_group"] = t.step_ratio();
  state.counters["commit_ns_per_seq"] = per_seq(t.commit_ns[1]);
  state.counters["one_group_commit_ns_per_seq"] = per_seq(t.commit_ns[0]);
  state.counters["with_commit_vs_one_group"] = t.with_commit_ratio();
  {
    std::vector<SequenceId> ids(static_cast<size_t>(seqs));
    std::iota(ids.begin(), ids.end(), 0);
    auto b = two->build_batch(ids, options);
    if (b.ok()) {
      state.counters["window_table_width"] = b->groups[1].host->max_blocks;
      state.counters["full_table_width"] = b->groups[0].host->max_blocks;
    }
  }
  state.SetLabel(std::string(staggered ? "staggered" : "lockstep") +
                 (fresh_tokens ? ", new tokens each cycle" : "") +
                 (backend == BackendKind::kNull ? ", null backend" : "") +
                 (options.ring_window_tables ? ", ring window table" : ""));
}
BENCHMARK(BM_ModelDecodeStep)
    ->Args({1024, 0, 0, 0, 0})
    ->Args({1024, 1, 0, 0, 0})
    ->Args({1024, 1, 1, 0, 0})
    ->Args({1024, 1, 0, 1, 0})
    ->Args({1024, 0, 0, 0, 1})
    ->Args({1024, 1, 0, 0, 1})
    ->Args({1024, 1, 1, 0, 1})
    ->Args({1024, 1, 0, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
