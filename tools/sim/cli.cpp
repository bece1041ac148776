#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <string>

#include "capacity.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "report.hpp"
#include "scheduler.hpp"
#include "svg.hpp"
#include "trace.hpp"
#include "workload.hpp"

namespace pagedkv {
namespace sim {

namespace {

struct Options {
  std::string model = "tiny";
  int32_t layers = 0, kv_heads = 0, head_dim = 0;  // 0: from the preset
  std::string dtype = "fp16";
  int32_t block_size = 16;
  int64_t device_blocks = 384, host_blocks = 1024;
  double device_gib = 0, host_gib = 0;  // > 0 overrides the block counts
  int32_t tp = 1;                       // tensor-parallel ranks (devices)
  std::string backend = "auto";
  std::string eviction = "lru";
  bool no_data = false;
  bool no_host_prefix_cache = false;
  std::string storage_dir;
  double storage_gib = 0;  // the storage tier's size bound (0: none)
  std::string trace, write_trace, timeline, plot;
  bool json = false;
  std::vector<int64_t> contexts;  // --context: capacity at these lengths
  WorkloadConfig workload;
  SchedulerConfig sched;
};

void add_flags(CLI::App& app, Options& o) {
  const std::string g1 = "Model and pools", g2 = "Workload", g3 = "Scheduler", g4 = "Output";
  std::string presets;
  for (const ModelShape& m : model_presets())
    presets += (presets.empty() ? "" : ", ") + m.name + " (" + shape_summary(m) + ")";
  app.add_option("--model", o.model, "model preset: " + presets)->group(g1)->capture_default_str();
  app.add_option("--layers", o.layers, "layers (overrides the preset)")->group(g1);
  app.add_option("--kv-heads", o.kv_heads, "KV heads (overrides the preset)")->group(g1);
  app.add_option("--head-dim", o.head_dim, "head dimension (overrides the preset)")->group(g1);
  app.add_option("--dtype", o.dtype, "KV element type: fp16, bf16, fp32, fp8")
      ->group(g1)
      ->capture_default_str();
  app.add_option("--block-size", o.block_size, "tokens per block")
      ->group(g1)
      ->capture_default_str();
  app.add_option("--device-blocks", o.device_blocks, "device pool blocks")
      ->group(g1)
      ->capture_default_str();
  app.add_option("--host-blocks", o.host_blocks, "pinned host pool blocks (0: no host tier)")
      ->group(g1)
      ->capture_default_str();
  app.add_option("--device-gib", o.device_gib,
                 "device pool size in GiB (overrides --device-blocks)")
      ->group(g1);
  app.add_option("--host-gib", o.host_gib, "host pool size in GiB (overrides --host-blocks)")
      ->group(g1);
  app.add_option("--tp", o.tp,
                 "tensor-parallel ranks: each of N devices holds 1/N of every group's KV heads in "
                 "the same blocks (--device-gib is per device), one control plane over the N "
                 "pools; needs --no-data")
      ->group(g1)
      ->capture_default_str();
  app.add_option("--backend", o.backend, "auto, cpu, cuda or null (null: as --no-data)")
      ->group(g1)
      ->capture_default_str();
  app.add_option("--eviction", o.eviction, "lru, fifo or none")->group(g1)->capture_default_str();
  app.add_flag("--no-host-prefix-cache", o.no_host_prefix_cache,
               "drop cached prefix blocks evicted from the device instead of moving them to the "
               "host tier (CacheConfig::cache_prefixes_on_host = false)")
      ->group(g1);
  app.add_option("--storage-dir", o.storage_dir,
                 "a storage tier (FileTier) in DIR behind the host tier: dropped host blocks are "
                 "written back, prompts fetch their blocks from it before admission")
      ->group(g1);
  app.add_option("--storage-gib", o.storage_gib, "the storage tier's size bound in GiB (0: none)")
      ->group(g1);
  app.add_option("--context", o.contexts,
                 "context lengths (tokens) at which to measure how many sequences fit in the "
                 "device budget, against the uniform cache of the same model (one or more)")
      ->group(g1);
  app.add_flag("--no-data", o.no_data,
               "run the cache on the null backend (no KV bytes, pools cost no memory): plan "
               "full-size models on a laptop")
      ->group(g1);

  WorkloadConfig& w = o.workload;
  app.add_option("--seed", w.seed, "generator seed")->group(g2)->capture_default_str();
  app.add_option("--requests", w.num_requests, "requests (each turn counts)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--rate", w.arrival_rate, "arrivals per simulated second (Poisson)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--prompt-mean", w.prompt_mean, "mean new-message length (log-normal)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--prompt-sigma", w.prompt_sigma, "log-normal sigma of prompt lengths")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--prompt-max", w.prompt_max, "longest new message")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--output-mean", w.output_mean, "mean output length (log-normal)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--output-sigma", w.output_sigma, "log-normal sigma of output lengths")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--output-max", w.output_max, "longest output")->group(g2)->capture_default_str();
  app.add_option("--system-prompts", w.system_prompts, "distinct shared system prompts")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--system-prompt-len", w.system_prompt_len, "tokens of each system prompt")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--system-prompt-share", w.system_prompt_share,
                 "share of conversations that use a system prompt")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--multi-turn-share", w.multi_turn_share,
                 "share of conversations with 2..max-turns turns")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--max-turns", w.max_turns, "turns of a multi-turn conversation (at most)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--think", w.think_s, "mean seconds between an answer and the next turn")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--parallel-share", w.parallel_share, "share of requests sampled n times (fork)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--samples", w.samples, "n of parallel sampling")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--spec-share", w.speculative_share,
                 "share of requests with speculative decoding (rollback of rejected drafts)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--priorities", w.priorities, "request priorities drawn from [0, n)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--namespaces", w.namespaces, "prefix-sharing namespaces (adapters)")
      ->group(g2)
      ->capture_default_str();
  app.add_option("--trace", o.trace, "replay a JSONL trace instead of generating")->group(g2);
  app.add_option("--write-trace", o.write_trace, "write the workload as a JSONL trace")->group(g2);

  SchedulerConfig& s = o.sched;
  app.add_option("--token-budget", s.token_budget, "tokens per step")
      ->group(g3)
      ->capture_default_str();
  app.add_option("--max-batch", s.max_batch, "sequences per step")
      ->group(g3)
      ->capture_default_str();
  app.add_option("--max-running", s.max_running, "sequences admitted at once")
      ->group(g3)
      ->capture_default_str();
  app.add_option("--spec-tokens", s.spec_tokens, "draft tokens per speculative step")
      ->group(g3)
      ->capture_default_str();
  app.add_option("--spec-accept", s.spec_accept, "acceptance probability of each draft token")
      ->group(g3)
      ->capture_default_str();
  app.add_option("--step-ms", s.step_ms, "simulated model time per step")
      ->group(g3)
      ->capture_default_str();
  app.add_option("--token-ms", s.token_ms, "simulated model time per token computed")
      ->group(g3)
      ->capture_default_str();
  app.add_flag("--check-invariants", s.check_invariants, "check the cache's invariants every step")
      ->group(g3);

  app.add_flag("--json", o.json, "print the report as one JSON object")->group(g4);
  app.add_option("--timeline", o.timeline, "write one CSV row per step to FILE")->group(g4);
  app.add_option("--plot", o.plot, "write an SVG chart (blocks per tier, hit rate) to FILE")
      ->group(g4);
}

// The device and host budgets in bytes: the GiB flags, else the block counts in blocks of the
// model's uniform cache (for a uniform model, its own blocks).
struct Budget {
  int64_t device_bytes = 0, host_bytes = 0;
};

Status build_config(const Options& o, CacheConfig* c, std::string* model_name, Budget* budget) {
  PAGEDKV_ASSIGN_OR_RETURN(ModelShape m, find_model(o.model));
  const bool custom = o.layers > 0 || o.kv_heads > 0 || o.head_dim > 0;
  *model_name = custom ? m.name + " (custom shape)" : m.name;
  if (o.layers > 0) m.num_layers = o.layers;
  if (o.kv_heads > 0) m.num_kv_heads = o.kv_heads;
  if (o.head_dim > 0) m.head_dim = o.head_dim;
  if (!parse_dtype(o.dtype.c_str(), &c->dtype))
    return invalid_argument("dtype: unknown element type '" + o.dtype + "'");
  PAGEDKV_RETURN_IF_ERROR(apply_model(m, c));
  c->block_size = o.block_size;
  static const std::map<std::string, BackendKind> kBackends = {{"auto", BackendKind::kAuto},
                                                               {"cpu", BackendKind::kCpu},
                                                               {"cuda", BackendKind::kCuda},
                                                               {"null", BackendKind::kNull}};
  static const std::map<std::string, EvictionPolicy> kPolicies = {{"lru", EvictionPolicy::kLru},
                                                                  {"fifo", EvictionPolicy::kFifo},
                                                                  {"none", EvictionPolicy::kNone}};
  auto b = kBackends.find(o.backend);
  if (b == kBackends.end()) return invalid_argument("backend: must be auto, cpu, cuda or null");
  c->backend = b->second;
  auto p = kPolicies.find(o.eviction);
  if (p == kPolicies.end()) return invalid_argument("eviction: must be lru, fifo or none");
  c->eviction_policy = p->second;
  c->cache_prefixes_on_host = !o.no_host_prefix_cache;
  c->num_device_blocks = o.device_blocks;
  c->num_host_blocks = o.host_blocks;
  for (const int64_t context : o.contexts) {
    if (context < 1)
      return invalid_argument("context: must be >= 1 token, got " + std::to_string(context));
  }
  const int64_t ubb = uniform_block_bytes(*c);
  if (ubb <= 0) {
    PAGEDKV_RETURN_IF_ERROR(c->validate());  // names the field
    return invalid_argument("model: a block's byte size overflows int64");
  }
  if (o.tp < 1) return invalid_argument("tp: must be >= 1, got " + std::to_string(o.tp));
  // With N ranks a K/V block takes 1/N of its bytes on each device, so N devices' GiB hold the
  // blocks; a latent (MLA) block is whole on every rank, so one device's GiB do.
  bool any_latent = c->kv_kind == KvKind::kLatent;
  for (const KvGroup& g : c->groups) any_latent |= g.kv_kind == KvKind::kLatent;
  if (o.tp > 1 && any_latent && !c->groups.empty()) {
    return invalid_argument(
        "tp: a model of a latent group beside others is not sized for "
        "tensor parallelism yet");
  }
  const int32_t devices_per_block = any_latent ? 1 : o.tp;
  budget->device_bytes = o.device_gib > 0
                             ? static_cast<int64_t>(o.device_gib * devices_per_block * 1073741824.0)
                             : o.device_blocks * ubb;
  budget->host_bytes =
      o.host_gib > 0 ? static_cast<int64_t>(o.host_gib * 1073741824.0) : o.host_blocks * ubb;
  if (!c->groups.empty()) {
    // A first split so that the config validates; run_cli splits again for the workload.
    if (o.device_blocks < 0 || o.host_blocks < 0)
      return invalid_argument("device-blocks/host-blocks: must be >= 0");
    PAGEDKV_ASSIGN_OR_RETURN(*c, c->with_pools(budget->device_bytes, budget->host_bytes, 1));
    return c->validate();
  }
  // The block size depends on the shape, so GiB turn into blocks only now.
  if (o.device_gib > 0 || o.host_gib > 0) {
    c->num_device_blocks = 1;
    PAGEDKV_RETURN_IF_ERROR(c->validate());
    c->num_device_blocks = o.device_gib > 0
                               ? blocks_in_gib(o.device_gib * devices_per_block, c->block_bytes())
                               : o.device_blocks;
    if (o.host_gib > 0) c->num_host_blocks = blocks_in_gib(o.host_gib, c->block_bytes());
  }
  return c->validate();
}

// The workload's context lengths (prompt + output), the groups' pools split for their mean, and
// the report's memory and capacity figures.
Status size_memory(const Options& o, const Budget& budget, const std::vector<Request>& requests,
                   CacheConfig* c, RunInfo* info) {
  int64_t total = 0, longest = 0;
  for (const Request& r : requests) {
    const int64_t context = static_cast<int64_t>(r.prompt.size()) + r.output_len;
    total += context;
    longest = std::max(longest, context);
  }
  const int64_t mean =
      requests.empty() ? 1 : std::max<int64_t>(1, total / static_cast<int64_t>(requests.size()));
  if (!c->groups.empty()) {
    PAGEDKV_ASSIGN_OR_RETURN(*c, c->with_pools(budget.device_bytes, budget.host_bytes, mean));
    PAGEDKV_RETURN_IF_ERROR(c->validate());
    info->pools_context = mean;
  }
  info->show_memory = !c->groups.empty() || c->kv_kind == KvKind::kLatent || !o.contexts.empty();
  if (!info->show_memory) return ok_status();
  info->memory.push_back({"workload mean", sequence_memory(*c, mean)});
  if (longest > mean) info->memory.push_back({"workload max", sequence_memory(*c, longest)});
  for (const int64_t context : o.contexts) {
    PAGEDKV_ASSIGN_OR_RETURN(Capacity cap, measure_capacity(*c, context, budget.device_bytes));
    info->capacity.push_back(cap);
  }
  return ok_status();
}

int fail(std::ostream& err, const Status& s) {
  err << "pagedkv-sim: " << s.message() << "\n";
  return 1;
}

// Redraws one progress line on a terminal, at most ten times a second.
class Progress {
 public:
  Progress(std::ostream& out, int64_t total) : out_(out), total_(total) {}
  void update(const StepRecord& t, const SimResult& r) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "\rstep %lld  t=%.1fs  done %lld/%lld  running %d waiting %d  device %lld host "
                  "%lld blocks  hit %.0f%%  ",
                  static_cast<long long>(t.step), t.sim_time_s,
                  static_cast<long long>(r.completed + r.rejected), static_cast<long long>(total_),
                  t.running, t.waiting, static_cast<long long>(t.device_used + t.device_cached),
                  static_cast<long long>(t.host_used + t.host_cached), 100 * t.hit_rate);
    out_ << buf << std::flush;
    drawn_ = true;
  }
  void clear() {
    if (drawn_) out_ << "\r" << std::string(110, ' ') << "\r" << std::flush;
  }

 private:
  std::ostream& out_;
  int64_t total_;
  std::chrono::steady_clock::time_point last_{};
  bool drawn_ = false;
};

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err, bool tty) {
  CLI::App app{
      "pagedkv-sim: drive an LLM-serving workload through pagedkv and report what "
      "happened (docs/pagedkv-sim.md)"};
  Options o;
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err);
  }

  CacheConfig config;
  std::string model_name;
  Budget budget;
  if (Status s = build_config(o, &config, &model_name, &budget); !s.ok()) return fail(err, s);

  std::vector<Request> requests;
  RunInfo info;
  info.model = model_name;
  if (!o.trace.empty()) {
    StatusOr<std::vector<Request>> t = read_trace_file(o.trace);
    if (!t.ok()) return fail(err, t.status());
    requests = std::move(t.value());
    info.workload = "trace " + o.trace + " (" + std::to_string(requests.size()) + " requests)";
  } else {
    StatusOr<std::vector<Request>> g = generate_workload(o.workload);
    if (!g.ok()) return fail(err, g.status());
    requests = std::move(g.value());
    const WorkloadConfig& w = o.workload;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "generated, seed %llu: %d requests at %.1f/s; messages ~%.0f tokens, outputs "
                  "~%.0f; %d system prompts x %d tokens (%.0f%% of conversations); %.0f%% "
                  "multi-turn; %.0f%% n=%d sampling; %.0f%% speculative; %d priorities",
                  static_cast<unsigned long long>(w.seed), w.num_requests, w.arrival_rate,
                  w.prompt_mean, w.output_mean, w.system_prompts, w.system_prompt_len,
                  100 * w.system_prompt_share, 100 * w.multi_turn_share, 100 * w.parallel_share,
                  w.samples, 100 * w.speculative_share, w.priorities);
    info.workload = buf;
  }
  if (!o.write_trace.empty()) {
    if (Status s = write_trace_file(o.write_trace, requests); !s.ok()) return fail(err, s);
  }
  if (Status s = size_memory(o, budget, requests, &config, &info); !s.ok()) return fail(err, s);

  if (config.backend == BackendKind::kNull) o.no_data = true;
  if (o.no_data && !o.storage_dir.empty()) {
    return fail(err, invalid_argument("--storage-dir needs KV bytes to store: drop --no-data"));
  }
  int64_t max_tokens = o.sched.token_budget;
  StatusOr<std::unique_ptr<Engine>> engine =
      o.no_data ? make_no_data_engine(config, o.tp)
                : make_cache_engine(
                      config, max_tokens,
                      StorageOptions{o.storage_dir, static_cast<int64_t>(o.storage_gib * (1 << 30)),
                                     "pagedkv-sim"},
                      o.tp);
  if (!engine.ok()) return fail(err, engine.status());
  Engine& e = *engine.value();
  info.backend = e.description();
  if (o.tp > 1) info.backend += ", tensor parallel over " + std::to_string(o.tp) + " ranks";
  info.has_data = e.has_data();
  info.device_alloc_ms = e.device_alloc_ms();
  info.host_alloc_ms = e.host_alloc_ms();

  Progress progress(out, static_cast<int64_t>(requests.size()));
  ProgressFn fn;
  if (tty && !o.json)
    fn = [&progress](const StepRecord& t, const SimResult& r) { progress.update(t, r); };
  StatusOr<SimResult> result = run_simulation(requests, e, config, o.sched, fn);
  progress.clear();
  if (!result.ok()) return fail(err, result.status());
  const SimResult& r = result.value();

  if (!o.timeline.empty()) {
    if (Status s = write_timeline_csv(o.timeline, r); !s.ok()) return fail(err, s);
  }
  if (!o.plot.empty()) {
    const std::string title = "pagedkv-sim: " + model_name + ", " +
                              std::to_string(config.num_device_blocks) + " device + " +
                              std::to_string(config.num_host_blocks) + " host blocks";
    if (Status s = write_svg(o.plot, counted_pools(config), r, title); !s.ok()) return fail(err, s);
  }
  if (o.json)
    out << report_json(config, o.sched, info, r).dump(2) << "\n";
  else
    write_text_report(out, config, o.sched, info, r);
  return 0;
}

}  // namespace sim
}  // namespace pagedkv
