// The decode step of two caches (a KvCache or a ModelKvCache each) taken in turns on the same
// sequences, for the benchmarks that give one's step as a ratio of the other's in the same run
// (pagedkv_bench_model, pagedkv_bench_tp): the sequences' set-up, and the timed loop of
// reserve_batch + build_batch, then commit_batch.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "benchmarks/cpu_time.hpp"
#include "pagedkv/control_types.hpp"

namespace pagedkv::bench {

/// Adds sequences 0 .. seqs-1 with their prompts (`prompt(id)`), reserves and commits them, and
/// makes them the active set (never offloaded). False when a call fails.
template <typename Cache, typename PromptFn>
bool add_decoding_sequences(Cache& cache, int64_t seqs, PromptFn prompt) {
  std::vector<SequenceId> ids;
  for (SequenceId s = 0; s < static_cast<SequenceId>(seqs); ++s) {
    const std::vector<TokenId> p = prompt(s);
    if (!cache.add_sequence(s, p).ok() || !cache.reserve(s, static_cast<int64_t>(p.size())).ok() ||
        !cache.commit(s, p).ok()) {
      return false;
    }
    ids.push_back(s);
  }
  return cache.set_active(ids).ok();
}

/// Thread CPU time of each cache's steps, in ns: [0] the first cache's, [1] the second's.
struct StepTimes {
  int64_t step_ns[2] = {0, 0};    // reserve_batch + build_batch
  int64_t commit_ns[2] = {0, 0};  // commit_batch
  bool failed = false;

  /// The second cache's reserve_batch + build_batch over the first's.
  double step_ratio() const { return ratio(step_ns[1], step_ns[0]); }
  /// The same over the whole control part of the step, commit_batch included.
  double with_commit_ratio() const {
    return ratio(step_ns[1] + commit_ns[1], step_ns[0] + commit_ns[0]);
  }
  /// `ns` of all the steps of `seqs` sequences in the benchmark's iterations, a sequence.
  static double per_sequence(int64_t ns, const benchmark::State& state, int64_t seqs) {
    return static_cast<double>(ns) / static_cast<double>(state.iterations() * seqs);
  }

 private:
  static double ratio(int64_t a, int64_t b) {
    return static_cast<double>(a) / static_cast<double>(std::max<int64_t>(b, 1));
  }
};

/// Runs the benchmark's iterations: each is one decode step of every sequence in both caches,
/// the two taking turns going first, each timed apart; the iteration time (manual time) is the
/// second cache's reserve_batch + build_batch. Every `cycle` steps the sequences go back to
/// their prompts, untimed (with `fresh_tokens`, the next cycle samples other tokens, so every
/// block is a new key). Both caches build their batches with `options`.
template <typename Cache, typename PromptFn>
StepTimes time_decode_steps(benchmark::State& state, Cache* caches[2], int64_t seqs, int64_t cycle,
                            bool fresh_tokens, PromptFn prompt, const BatchOptions& options = {}) {
  std::vector<SequenceId> ids;
  for (SequenceId s = 0; s < static_cast<SequenceId>(seqs); ++s) ids.push_back(s);
  std::vector<TokenId> sampled(ids.size(), 7);
  StepTimes t;
  int64_t step = 0;
  int64_t iteration = 0;
  for (auto _ : state) {
    for (int turn = 0; turn < 2; ++turn) {
      const int m = (turn + static_cast<int>(iteration & 1)) % 2;
      const int64_t t0 = cpu_now_ns();
      t.failed |= !caches[m]->reserve_batch(ids, 1).ok();
      t.failed |= !caches[m]->build_batch(ids, options).ok();
      const int64_t t1 = cpu_now_ns();
      t.failed |= !caches[m]->commit_batch(ids, sampled, 1).ok();
      const int64_t t2 = cpu_now_ns();
      t.step_ns[m] += cpu_interval_ns(t0, t1);
      t.commit_ns[m] += cpu_interval_ns(t1, t2);
      if (m == 1) state.SetIterationTime(static_cast<double>(cpu_interval_ns(t0, t1)) * 1e-9);
    }
    ++iteration;
    if (++step == cycle) {
      if (fresh_tokens) {
        for (TokenId& token : sampled) ++token;
      }
      // Back to the prompt: a window group no longer holds the prompt's first blocks, so each
      // sequence starts again from nothing.
      for (SequenceId id : ids) {
        const std::vector<TokenId> p = prompt(id);
        for (int m = 0; m < 2; ++m) {
          t.failed |= !caches[m]->rollback(id, 0).ok();
          t.failed |= !caches[m]->reserve(id, static_cast<int64_t>(p.size())).ok();
          t.failed |= !caches[m]->commit(id, p).ok();
        }
      }
      step = 0;
    }
  }
  return t;
}

}  // namespace pagedkv::bench
