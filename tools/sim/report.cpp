#include "report.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "pagedkv/stats_fields.hpp"

namespace pagedkv {
namespace sim {

namespace {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double ratio(int64_t a, int64_t b) {
  return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
}

std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// The group the cache's own counts are in (KvCache::full_group(): the full-attention group with
// the most device blocks, whose blocks every other group's pages follow).
CacheConfig counted_group(const CacheConfig& c) {
  int32_t owner = -1;
  for (int32_t g = 0; g < static_cast<int32_t>(c.groups.size()); ++g) {
    const KvGroup& k = c.groups[static_cast<size_t>(g)];
    if (k.sliding_window == 0 &&
        (owner < 0 || k.num_device_blocks > c.groups[static_cast<size_t>(owner)].num_device_blocks))
      owner = g;
  }
  return c.group_config(std::max(owner, 0));
}

int64_t counted_block_bytes(const CacheConfig& c) { return counted_group(c).block_bytes(); }

// Bytes of the cache's count `field`: the owner group's blocks at its size; for evictions, which
// every group counts for its own pages, each group's at its own size.
int64_t bytes_of(const CacheConfig& c, const SimResult& r, int64_t ControlStats::*field) {
  if (field != &ControlStats::blocks_evicted || r.group_stats.size() != c.groups.size() ||
      c.groups.empty()) {
    return r.stats.*field * counted_block_bytes(c);
  }
  int64_t bytes = 0;
  for (int32_t g = 0; g < c.num_groups(); ++g)
    bytes += r.group_stats[static_cast<size_t>(g)].*field * c.group_config(g).block_bytes();
  return bytes;
}

// Bytes of the device (or host) pools over the groups.
int64_t pool_bytes(const CacheConfig& c, bool host) {
  int64_t bytes = 0;
  for (int32_t g = 0; g < c.num_groups(); ++g) {
    const CacheConfig gc = c.group_config(g);
    bytes += (host ? gc.num_host_blocks : gc.num_device_blocks) * gc.block_bytes();
  }
  return bytes;
}

const char* kind_name(KvKind k) { return k == KvKind::kLatent ? "latent" : "key-value"; }

}  // namespace

CacheConfig counted_pools(const CacheConfig& c) {
  if (c.groups.empty()) return c;
  CacheConfig out = c;
  const CacheConfig g = counted_group(c);
  out.num_device_blocks = g.num_device_blocks;
  out.num_host_blocks = g.num_host_blocks;
  return out;
}

namespace {

nlohmann::json memory_json(const SequenceMemory& m) {
  nlohmann::json groups = nlohmann::json::array();
  for (const GroupMemory& g : m.groups) {
    groups.push_back({{"name", g.name},
                      {"layers", g.layers},
                      {"sliding_window", g.sliding_window},
                      {"block_bytes", g.block_bytes},
                      {"blocks", g.blocks},
                      {"bytes", g.bytes}});
  }
  return {{"context", m.context},
          {"groups", groups},
          {"bytes", m.bytes},
          {"uniform_bytes", m.uniform_bytes},
          {"gain", m.gain()}};
}

// "full 26 blocks (32.5 MiB), window 26 blocks (169.0 MiB); total 201.5 MiB vs 201.5 MiB
// uniform (1.00x)"
std::string memory_line(const SequenceMemory& m) {
  std::string s;
  for (const GroupMemory& g : m.groups) {
    s += (s.empty() ? "" : ", ") + g.name + " " + std::to_string(g.blocks) + " blocks (" +
         bytes_str(static_cast<double>(g.bytes)) + ")";
  }
  return s + fmt("; total %s vs %s uniform (%.2fx)",
                 bytes_str(static_cast<double>(m.bytes)).c_str(),
                 bytes_str(static_cast<double>(m.uniform_bytes)).c_str(), m.gain());
}

}  // namespace

std::string capacity_line(const Capacity& c) {
  const std::string gain = c.uniform_sequences > 0 ? fmt("%.2fx", c.gain())
                                                   : std::string("the uniform cache holds none");
  return fmt("capacity: %" PRId64 " sequences vs %" PRId64 " uniform (%s) at %" PRId64
             " tokens in %s; per sequence %s vs %s uniform (%.2fx)",
             c.sequences, c.uniform_sequences, gain.c_str(), c.context,
             bytes_str(static_cast<double>(c.budget_bytes)).c_str(),
             bytes_str(static_cast<double>(c.memory.bytes)).c_str(),
             bytes_str(static_cast<double>(c.memory.uniform_bytes)).c_str(), c.memory.gain());
}

nlohmann::json stats_json(const ControlStats& st) {
  nlohmann::json out = nlohmann::json::object();
  for_each_stat(st, [&out](const std::string& name, int64_t value) {
    std::string pointer = "/" + name;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    out[nlohmann::json::json_pointer(pointer)] = value;
  });
  return out;
}

Summary summarize(const SimResult& r) {
  Summary s;
  std::vector<double> plan, data;
  double dev_sum = 0, host_sum = 0;
  for (const StepRecord& t : r.timeline) {
    plan.push_back(t.plan_us);
    data.push_back(t.data_us);
    s.plan_mean_us += t.plan_us;
    s.data_mean_us += t.data_us;
    s.device_peak = std::max(s.device_peak, t.device_used + t.device_cached);
    s.device_peak_used = std::max(s.device_peak_used, t.device_used);
    s.host_peak = std::max(s.host_peak, t.host_used + t.host_cached);
    s.host_peak_used = std::max(s.host_peak_used, t.host_used);
    dev_sum += static_cast<double>(t.device_used + t.device_cached);
    host_sum += static_cast<double>(t.host_used + t.host_cached);
  }
  const double n = static_cast<double>(std::max<size_t>(r.timeline.size(), 1));
  s.data_total_s = s.data_mean_us / 1e6;
  s.plan_mean_us /= n;
  s.data_mean_us /= n;
  s.plan_p99_us = percentile(plan, 0.99);
  s.data_p99_us = percentile(data, 0.99);
  s.device_mean = dev_sum / n;
  s.host_mean = host_sum / n;
  return s;
}

PrefixSplit split_prefix_hits(const SimResult& r) {
  const ControlStats& st = r.stats;
  PrefixSplit p;
  p.host_hit_blocks = st.prefix_host_hit_blocks;
  // Host hit blocks are whole hit blocks found on the host (a subset of prefix_hit_blocks).
  p.device_hit_blocks = std::max<int64_t>(0, st.prefix_hit_blocks - st.prefix_host_hit_blocks);
  p.token_hit_rate = ratio(st.prefix_hit_tokens, st.prefix_query_tokens);
  p.block_hit_rate = ratio(st.prefix_hit_blocks, r.lookup_blocks);
  p.device_block_hit_rate = ratio(p.device_hit_blocks, r.lookup_blocks);
  p.host_block_hit_rate = ratio(p.host_hit_blocks, r.lookup_blocks);
  return p;
}

nlohmann::json report_json(const CacheConfig& c, const SchedulerConfig& sc, const RunInfo& info,
                           const SimResult& r) {
  const Summary s = summarize(r);
  const PrefixSplit split = split_prefix_hits(r);
  const ControlStats& st = r.stats;
  const int64_t bb = c.block_bytes();
  nlohmann::json j;
  j["model"] = {
      {"name", info.model},     {"layers", c.num_layers},       {"kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim}, {"dtype", dtype_name(c.dtype)}, {"block_size", c.block_size},
      {"block_bytes", bb}};
  j["pools"] = {{"device_blocks", c.num_device_blocks},    {"device_bytes", pool_bytes(c, false)},
                {"host_blocks", c.num_host_blocks},        {"host_bytes", pool_bytes(c, true)},
                {"device_alloc_ms", info.device_alloc_ms}, {"host_alloc_ms", info.host_alloc_ms}};
  if (!c.groups.empty()) {
    nlohmann::json groups = nlohmann::json::array();
    for (int32_t g = 0; g < c.num_groups(); ++g) {
      const CacheConfig gc = c.group_config(g);
      nlohmann::json x = {{"name", c.groups[static_cast<size_t>(g)].name},
                          {"layers", gc.num_layers},
                          {"kv_heads", gc.num_kv_heads},
                          {"head_dim", gc.head_dim},
                          {"kind", kind_name(gc.kv_kind)},
                          {"sliding_window", gc.sliding_window},
                          {"block_bytes", gc.block_bytes()},
                          {"device_blocks", gc.num_device_blocks},
                          {"host_blocks", gc.num_host_blocks}};
      if (static_cast<size_t>(g) < r.group_stats.size())
        x["stats"] = stats_json(r.group_stats[static_cast<size_t>(g)]);
      groups.push_back(x);
    }
    j["model"]["groups"] = groups;
    j["pools"]["split_for_context"] = info.pools_context;
  }
  if (c.kv_kind == KvKind::kLatent) {
    j["model"]["kind"] = kind_name(c.kv_kind);
    j["model"]["rope_dim"] = c.rope_dim;
  }
  if (info.show_memory) {
    nlohmann::json memory = nlohmann::json::array();
    for (const RunInfo::Memory& m : info.memory) {
      nlohmann::json x = memory_json(m.memory);
      x["label"] = m.label;
      memory.push_back(x);
    }
    j["memory"] = memory;
    nlohmann::json capacity = nlohmann::json::array();
    for (const Capacity& cap : info.capacity) {
      capacity.push_back({{"context", cap.context},
                          {"budget_bytes", cap.budget_bytes},
                          {"sequences", cap.sequences},
                          {"uniform_sequences", cap.uniform_sequences},
                          {"gain", cap.gain()},
                          {"memory", memory_json(cap.memory)}});
    }
    j["capacity"] = capacity;
  }
  j["backend"] = info.backend;
  j["data"] = info.has_data;
  j["workload"] = info.workload;
  j["scheduler"] = {{"token_budget", sc.token_budget}, {"max_batch", sc.max_batch},
                    {"max_running", sc.max_running},   {"spec_tokens", sc.spec_tokens},
                    {"spec_accept", sc.spec_accept},   {"step_ms", sc.step_ms},
                    {"token_ms", sc.token_ms}};
  j["requests"] = {{"total", r.requests}, {"completed", r.completed}, {"rejected", r.rejected}};
  j["sequences"] = {{"added", r.sequences},
                    {"forks", r.forks},
                    {"preempted", r.preemptions},
                    {"dropped_by_cache", r.dropped}};
  j["tokens"] = {{"prompt", r.prompt_tokens},        {"prefill_computed", r.prefill_tokens},
                 {"prefix_cached", r.cached_tokens}, {"output", r.output_tokens},
                 {"draft", r.draft_tokens},          {"draft_rejected", r.rejected_tokens},
                 {"rollbacks", r.rollbacks}};
  j["prefix"] = {{"lookups", st.prefix_queries},
                 {"lookup_blocks", r.lookup_blocks},
                 {"hit_blocks", st.prefix_hit_blocks},
                 {"miss_blocks", st.prefix_miss_blocks},
                 {"lookup_tokens", st.prefix_query_tokens},
                 {"hit_tokens", st.prefix_hit_tokens},
                 {"device_hit_blocks", split.device_hit_blocks},
                 {"host_hit_blocks", split.host_hit_blocks},
                 {"hit_rate", split.token_hit_rate},
                 {"block_hit_rate", split.block_hit_rate},
                 {"device_block_hit_rate", split.device_block_hit_rate},
                 {"host_hit_rate", split.host_block_hit_rate}};
  j["host_prefix_cache"] = {{"demotion", c.num_host_blocks > 0 && c.cache_prefixes_on_host},
                            {"demoted_blocks", st.blocks_demoted},
                            {"demoted_bytes", bytes_of(c, r, &ControlStats::blocks_demoted)},
                            {"dropped_blocks", st.host_blocks_dropped},
                            {"hit_blocks", st.prefix_host_hit_blocks}};
  const CacheConfig counted = counted_pools(c);
  j["blocks"] = {{"device",
                  {{"capacity", counted.num_device_blocks},
                   {"peak", s.device_peak},
                   {"peak_referenced", s.device_peak_used},
                   {"mean", s.device_mean}}},
                 {"host",
                  {{"capacity", counted.num_host_blocks},
                   {"peak", s.host_peak},
                   {"peak_referenced", s.host_peak_used},
                   {"mean", s.host_mean}}}};
  j["evictions"] = {{"cached_blocks", st.blocks_evicted},
                    {"cached_bytes", bytes_of(c, r, &ControlStats::blocks_evicted)},
                    {"sequences_dropped", st.sequences_evicted}};
  j["offloads"] = {{"sequences", st.sequences_offloaded},
                   {"blocks", st.blocks_offloaded},
                   {"bytes", bytes_of(c, r, &ControlStats::blocks_offloaded)}};
  j["restores"] = {{"sequences", st.sequences_restored},
                   {"blocks", st.blocks_restored},
                   {"bytes", bytes_of(c, r, &ControlStats::blocks_restored)}};
  j["copy_on_write"] = st.copy_on_write;
  j["stats"] = stats_json(st);
  j["time"] = {{"steps", r.steps},
               {"simulated_s", r.sim_time_s},
               {"wall_s", r.wall_s},
               {"plan_us_mean", s.plan_mean_us},
               {"plan_us_p99", s.plan_p99_us},
               {"data_phase_us_mean", s.data_mean_us},
               {"data_phase_us_p99", s.data_p99_us},
               {"data_phase_total_s", s.data_total_s}};
  return j;
}

void write_text_report(std::ostream& out, const CacheConfig& c, const SchedulerConfig& sc,
                       const RunInfo& info, const SimResult& r) {
  const Summary s = summarize(r);
  const PrefixSplit split = split_prefix_hits(r);
  const ControlStats& st = r.stats;
  const int64_t bb = c.block_bytes();
  const CacheConfig counted = counted_pools(c);
  const double dev_cap = static_cast<double>(std::max<int64_t>(counted.num_device_blocks, 1));
  const double host_cap = static_cast<double>(std::max<int64_t>(counted.num_host_blocks, 1));
  out << "pagedkv-sim\n";
  if (c.kv_kind == KvKind::kLatent)
    out << fmt(
        "  model      %s: %d layers x latent %d (rope %d, keys only), %s, %d tokens/block "
        "(%s/block)\n",
        info.model.c_str(), c.num_layers, c.head_dim, c.rope_dim, dtype_name(c.dtype), c.block_size,
        bytes_str(static_cast<double>(bb)).c_str());
  else
    out << fmt(
        "  model      %s: %d layers x %d KV heads x %d dims, %s, %d tokens/block (%s/block)\n",
        info.model.c_str(), c.num_layers, c.num_kv_heads, c.head_dim, dtype_name(c.dtype),
        c.block_size, bytes_str(static_cast<double>(bb)).c_str());
  for (int32_t g = 0; g < static_cast<int32_t>(c.groups.size()); ++g) {
    const CacheConfig gc = c.group_config(g);
    const std::string window =
        gc.sliding_window > 0 ? fmt("window %d tokens", gc.sliding_window) : "full attention";
    out << fmt("  group %-4s %-6s %d layers, %s, %s/block; device %" PRId64
               " blocks (%s), host %" PRId64 " blocks (%s)\n",
               std::to_string(g).c_str(), c.groups[static_cast<size_t>(g)].name.c_str(),
               gc.num_layers, window.c_str(),
               bytes_str(static_cast<double>(gc.block_bytes())).c_str(), gc.num_device_blocks,
               bytes_str(static_cast<double>(gc.num_device_blocks * gc.block_bytes())).c_str(),
               gc.num_host_blocks,
               bytes_str(static_cast<double>(gc.num_host_blocks * gc.block_bytes())).c_str());
  }
  out << fmt("  pools      device %" PRId64 " blocks (%s, %.1f ms), host %" PRId64
             " blocks (%s, %.1f ms)%s\n",
             c.num_device_blocks, bytes_str(static_cast<double>(pool_bytes(c, false))).c_str(),
             info.device_alloc_ms, c.num_host_blocks,
             bytes_str(static_cast<double>(pool_bytes(c, true))).c_str(), info.host_alloc_ms,
             c.groups.empty() ? ""
                              : fmt(" over the groups, split for %" PRId64 "-token sequences",
                                    info.pools_context)
                                    .c_str());
  out << "  backend    " << info.backend << "\n";
  out << "  workload   " << info.workload << "\n";
  out << fmt("  scheduler  %" PRId64 " tokens/step, <= %d sequences/step, <= %d admitted\n",
             sc.token_budget, sc.max_batch, sc.max_running);
  out << "\nrequests\n";
  out << fmt("  completed  %" PRId64 " of %" PRId64 " (%" PRId64
             " rejected: larger than the device pool)\n",
             r.completed, r.requests, r.rejected);
  out << fmt("  sequences  %" PRId64 " added, %" PRId64 " forked (parallel sampling), %" PRId64
             " preempted and recomputed, %" PRId64 " dropped by the cache and recomputed\n",
             r.sequences, r.forks, r.preemptions, r.dropped);
  out << fmt("  tokens     prompt %" PRId64 ", prefill computed %" PRId64
             ", from prefix cache %" PRId64 ", output %" PRId64 "\n",
             r.prompt_tokens, r.prefill_tokens, r.cached_tokens, r.output_tokens);
  out << fmt("  speculative %" PRId64 " draft tokens, %" PRId64 " rejected (%" PRId64
             " rollbacks)\n",
             r.draft_tokens, r.rejected_tokens, r.rollbacks);
  out << "\ncache\n";
  out << fmt("  prefix hit rate  %.1f%% of prompt tokens (%" PRId64 " of %" PRId64
             "), %.1f%% of full blocks: device %.1f%%, host %.1f%% (%" PRId64 " blocks)\n",
             100 * split.token_hit_rate, st.prefix_hit_tokens, st.prefix_query_tokens,
             100 * split.block_hit_rate, 100 * split.device_block_hit_rate,
             100 * split.host_block_hit_rate, split.host_hit_blocks);
  if (c.num_host_blocks == 0)
    out << "  host cache       no host tier\n";
  else
    out << fmt(
        "  host cache       %" PRId64 " cached blocks demoted from the device (%s), %" PRId64
        " dropped from the host (least recently used)%s\n",
        st.blocks_demoted,
        bytes_str(static_cast<double>(bytes_of(c, r, &ControlStats::blocks_demoted))).c_str(),
        st.host_blocks_dropped,
        c.cache_prefixes_on_host ? "" : "; demotion off (--no-host-prefix-cache)");
  if (counted.num_device_blocks != c.num_device_blocks)
    out << "  blocks below     the full-attention group's: the groups share its logical blocks\n";
  out << fmt("  device blocks    peak %" PRId64 " (%.0f%%), mean %.0f (%.0f%%) of %" PRId64
             " [referenced + cached]; peak referenced %" PRId64 "\n",
             s.device_peak, 100 * s.device_peak / dev_cap, s.device_mean,
             100 * s.device_mean / dev_cap, counted.num_device_blocks, s.device_peak_used);
  if (c.num_host_blocks > 0)
    out << fmt("  host blocks      peak %" PRId64 " (%.0f%%), mean %.0f (%.0f%%) of %" PRId64
               " [referenced + cached]; peak referenced %" PRId64 "\n",
               s.host_peak, 100 * s.host_peak / host_cap, s.host_mean, 100 * s.host_mean / host_cap,
               counted.num_host_blocks, s.host_peak_used);
  else
    out << "  host blocks      no host tier\n";
  out << fmt("  evictions        %" PRId64 " cached device blocks dropped (%s), %" PRId64
             " sequences dropped\n",
             st.blocks_evicted,
             bytes_str(static_cast<double>(bytes_of(c, r, &ControlStats::blocks_evicted))).c_str(),
             st.sequences_evicted);
  out << fmt(
      "  offloads         %" PRId64 " sequences, %" PRId64 " blocks (%s)\n", st.sequences_offloaded,
      st.blocks_offloaded,
      bytes_str(static_cast<double>(bytes_of(c, r, &ControlStats::blocks_offloaded))).c_str());
  out << fmt(
      "  restores         %" PRId64 " sequences, %" PRId64 " blocks (%s)\n", st.sequences_restored,
      st.blocks_restored,
      bytes_str(static_cast<double>(bytes_of(c, r, &ControlStats::blocks_restored))).c_str());
  out << fmt("  copy-on-write    %" PRId64 " blocks\n", st.copy_on_write);
  if (info.show_memory) {
    out << "\nmemory per sequence (a decoding sequence: its context and the next token's slot)\n";
    for (const RunInfo::Memory& m : info.memory) {
      out << fmt("  %6" PRId64 " tokens (%s): ", m.memory.context, m.label.c_str())
          << memory_line(m.memory) << "\n";
    }
    for (const Capacity& cap : info.capacity) out << "  " << capacity_line(cap) << "\n";
  }
  out << "\ncounters (every ControlStats count at the end of the run)\n";
  for_each_stat(st, [&out](const std::string& name, int64_t value, const char* doc) {
    out << fmt("  %-24s %14" PRId64 "  %s\n", name.c_str(), value, doc);
  });
  out << "\ntime\n";
  out << fmt("  steps            %" PRId64 " (%.1f s simulated, %.2f s wall)\n", r.steps,
             r.sim_time_s, r.wall_s);
  out << fmt(
      "  host per step    mean %.1f us, p99 %.1f us  [scheduler + control plane + "
      "enqueueing transfers: wall time outside the data phase]\n",
      s.plan_mean_us, s.plan_p99_us);
  if (info.has_data)
    out << fmt(
        "  data phase       mean %.1f us, p99 %.1f us, total %.2f s  [write_kv of every "
        "layer + synchronize: kernels and unfinished transfers, wall]\n",
        s.data_mean_us, s.data_p99_us, s.data_total_s);
  else
    out << "  data phase       none (--no-data)\n";
}

Status write_timeline_csv(const std::string& path, const SimResult& r) {
  std::ofstream out(path);
  if (!out) return unavailable("cannot write " + path);
  out << "step,sim_time_s,batch,prefill_tokens,decode_tokens,running,waiting,device_used,"
         "device_cached,device_free,host_used,host_cached,hit_rate,offloaded_blocks,"
         "restored_blocks,"
         "evicted_blocks,preemptions,plan_us,data_us";
  for (const StatInfo& info : stat_infos()) out << ",stats." << info.name;
  out << "\n";
  for (const StepRecord& t : r.timeline) {
    out << fmt("%" PRId64 ",%.6f,%d,%" PRId64 ",%" PRId64 ",%d,%d,%" PRId64 ",%" PRId64 ",%" PRId64
               ",%" PRId64 ",%" PRId64 ",%.6f,%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
               ",%.1f,%.1f",
               t.step, t.sim_time_s, t.batch, t.prefill_tokens, t.decode_tokens, t.running,
               t.waiting, t.device_used, t.device_cached, t.device_free, t.host_used, t.host_cached,
               t.hit_rate, t.offloaded_blocks, t.restored_blocks, t.evicted_blocks, t.preemptions,
               t.plan_us, t.data_us);
    for (int64_t v : stat_values(t.stats)) out << "," << v;
    out << "\n";
  }
  out.flush();
  return out ? ok_status() : unavailable("writing " + path + " failed");
}

}  // namespace sim
}  // namespace pagedkv
