// The run's report: a text summary, the same as one JSON object, and the per-step timeline.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "capacity.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/status.hpp"
#include "scheduler.hpp"

namespace pagedkv {
namespace sim {

/// What the report says about the setup (besides the results).
struct RunInfo {
  std::string model;     // preset name or "custom"
  std::string workload;  // "generated (seed 1)" or "trace FILE"
  std::string backend;   // engine description
  bool has_data = true;
  double device_alloc_ms = 0, host_alloc_ms = 0;
  /// The "memory" and "capacity" sections: printed when show_memory (a model of several KV
  /// groups or a latent one, or --context given); a plain uniform model's report is as before.
  bool show_memory = false;
  int64_t pools_context = 0;  // the context the groups' pools were split for (0: no groups)
  struct Memory {
    std::string label;  // "workload mean", "workload max", "--context"
    SequenceMemory memory;
  };
  std::vector<Memory> memory;
  std::vector<Capacity> capacity;  // one per --context
};

/// Aggregates of the timeline that both report forms print.
struct Summary {
  double plan_mean_us = 0, plan_p99_us = 0;
  double data_mean_us = 0, data_p99_us = 0, data_total_s = 0;
  int64_t device_peak = 0, host_peak = 0;  // blocks referenced or cached, per tier
  double device_mean = 0, host_mean = 0;
  int64_t device_peak_used = 0, host_peak_used = 0;  // referenced by sequences only
};

/// The prefix cache's outcome split by tier. Block rates are shares of the full prompt blocks
/// looked up (SimResult::lookup_blocks): `host_hit_blocks` is what the cache counted as found on
/// the host tier (ControlStats::prefix_host_hit_blocks), the device share is the rest of the hit
/// blocks. Without a host tier (or with cache_prefixes_on_host off) the host share is 0.
struct PrefixSplit {
  double token_hit_rate = 0;  // prompt tokens served from the cache, either tier
  double block_hit_rate = 0;  // full prompt blocks hit, either tier
  double device_block_hit_rate = 0;
  double host_block_hit_rate = 0;
  int64_t device_hit_blocks = 0, host_hit_blocks = 0;
};

/// Computes the split from the cache's counters and the simulator's lookup count.
PrefixSplit split_prefix_hits(const SimResult& r);

/// Computes the timeline aggregates.
Summary summarize(const SimResult& r);

/// The report as one JSON object (field meanings in docs/pagedkv-sim.md).
/// `cache` with the pool sizes the run's counts (SimResult::stats) are in: with groups, the pools
/// of the group that owns the blocks (SimResult::group_stats has every group's); else `cache`.
CacheConfig counted_pools(const CacheConfig& cache);

nlohmann::json report_json(const CacheConfig& cache, const SchedulerConfig& sched,
                           const RunInfo& info, const SimResult& r);

/// "capacity: N sequences vs M uniform (x.xxx) at C tokens in B; per sequence ..": the report's
/// line for one measured capacity.
std::string capacity_line(const Capacity& c);

/// Writes the human-readable report.
void write_text_report(std::ostream& out, const CacheConfig& cache, const SchedulerConfig& sched,
                       const RunInfo& info, const SimResult& r);

/// Every count of `st` under its own name (for_each_stat), tiers as objects:
/// {"device": {"total_blocks": ..}, .., "blocks_demoted": ..}. The report's "stats" section.
nlohmann::json stats_json(const ControlStats& st);

/// Writes the timeline as CSV, one row per step, with a header: the StepRecord columns, then
/// every count of the step's stats as "stats.NAME" (stat_infos order).
Status write_timeline_csv(const std::string& path, const SimResult& r);

}  // namespace sim
}  // namespace pagedkv
