// A continuous-batching scheduler that drives an Engine with a workload and records what
// happened, step by step.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/status.hpp"
#include "workload.hpp"

namespace pagedkv {
namespace sim {

/// Scheduler knobs, and the simulated cost model that turns steps into (simulated) seconds.
struct SchedulerConfig {
  int64_t token_budget = 256;     // tokens (prefill chunks + decode tokens) per step
  int32_t max_batch = 32;         // sequences per step (the active set)
  int32_t max_running = 48;       // sequences admitted at once (resident, in flight or offloaded)
  int32_t spec_tokens = 3;        // draft tokens per speculative decode step
  double spec_accept = 0.7;       // chance that each draft token is accepted (in order)
  double step_ms = 6.0;           // simulated model time of a step ...
  double token_ms = 0.05;         // ... plus this per token computed
  bool check_invariants = false;  // recount the cache's invariants after every step (slow)
  /// kInvalidArgument naming the first bad field.
  Status validate() const;
};

/// One row of the timeline: the state after a step.
struct StepRecord {
  int64_t step = 0;
  double sim_time_s = 0;  // simulated time at the end of the step
  int32_t batch = 0;      // sequences in the step
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;  // including draft tokens
  int32_t running = 0;        // admitted sequences after the step
  int32_t waiting = 0;        // arrived, not admitted
  int64_t device_used = 0, device_cached = 0, device_free = 0;
  int64_t host_used = 0;    // host blocks referenced by (offloaded) sequences
  int64_t host_cached = 0;  // host blocks of the prefix cache that nobody references
  double hit_rate = 0;      // cumulative prefix hit rate (tokens, both tiers)
  int64_t offloaded_blocks = 0, restored_blocks = 0, evicted_blocks = 0;  // cumulative
  int64_t preemptions = 0;                                                // cumulative
  double plan_us = 0;  // host time of the step outside the data phase
  double data_us = 0;  // data phase: write_kv enqueue + synchronize, wall
  ControlStats stats;  // the cache's counts after the step (the CSV's stats.* columns)
};

/// Everything the report needs.
struct SimResult {
  int64_t requests = 0, completed = 0, rejected = 0;
  int64_t sequences = 0;  // sequences added (samples, forks and recomputes included)
  int64_t forks = 0;
  int64_t prompt_tokens = 0;   // prompt tokens of the requests, once each
  int64_t prefill_tokens = 0;  // prompt tokens computed (recompute included, hits excluded)
  int64_t cached_tokens = 0;   // prompt tokens served from the prefix cache
  int64_t output_tokens = 0;   // accepted output tokens
  int64_t draft_tokens = 0, rejected_tokens = 0;  // speculative decoding
  int64_t rollbacks = 0;
  int64_t preemptions = 0;    // erased by the scheduler on kResourceExhausted, recomputed
  int64_t dropped = 0;        // dropped by the cache to make room, recomputed
  int64_t lookup_blocks = 0;  // full prompt blocks looked up, counted by the simulator
  int64_t steps = 0;
  double sim_time_s = 0, wall_s = 0;
  ControlStats stats;  // the cache's counters at the end (Engine::stats)
  /// Each KV group's counters at the end (Engine::group_stats); empty with one group.
  std::vector<ControlStats> group_stats;
  std::vector<StepRecord> timeline;
};

/// Called after every step (for a progress line).
using ProgressFn = std::function<void(const StepRecord&, const SimResult&)>;

/// Runs `requests` to completion on `engine`. Errors of the cache other than kResourceExhausted
/// end the run with that error (nothing partial is reported).
StatusOr<SimResult> run_simulation(const std::vector<Request>& requests, Engine& engine,
                                   const CacheConfig& cache, const SchedulerConfig& config,
                                   const ProgressFn& progress = {});

}  // namespace sim
}  // namespace pagedkv
