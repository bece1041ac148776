// End-to-end runs of the scheduler on a real KvCache (CPU backend) and on the control plane
// alone, and of the command line: prefix hit rate, offload under pressure, --json, errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "engine.hpp"
#include "pagedkv/model_cache.hpp"
#include "pagedkv/stats_fields.hpp"
#include "report.hpp"
#include "scheduler.hpp"
#include "support/status_matchers.hpp"
#include "workload.hpp"

namespace pagedkv::sim {
namespace {

CacheConfig small_config(int64_t device_blocks, int64_t host_blocks) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.block_size = 16;
  c.num_device_blocks = device_blocks;
  c.num_host_blocks = host_blocks;
  c.backend = BackendKind::kCpu;
  return c;
}

SimResult run_or_die(const std::vector<Request>& w, const CacheConfig& c, SchedulerConfig s,
                     bool data = true) {
  s.check_invariants = true;
  auto engine = data ? make_cache_engine(c, s.token_budget) : make_no_data_engine(c);
  EXPECT_OK(engine);
  auto r = run_simulation(w, *engine.value(), c, s);
  EXPECT_OK(r);
  return r.ok() ? r.value() : SimResult{};
}

// Every request starts with the same system prompt, so every lookup after the first hits the
// prefix's full blocks; the expected rate is computed from the workload itself.
TEST(Simulation, SharedSystemPromptHitRateMatchesItsShareOfTokens) {
  WorkloadConfig w;
  w.num_requests = 60;
  w.arrival_rate = 2;  // the first prompt is committed before the second arrives
  w.system_prompts = 1;
  w.system_prompt_share = 1;
  w.system_prompt_len = 200;  // 12 full blocks + 8 tokens
  w.prompt_mean = 60;
  w.multi_turn_share = 0;
  w.parallel_share = 0;
  w.speculative_share = 0;
  w.output_mean = 16;
  auto reqs = generate_workload(w);
  ASSERT_OK(reqs);
  const CacheConfig c = small_config(1024, 0);
  const SimResult r = run_or_die(reqs.value(), c, SchedulerConfig{});
  ASSERT_EQ(r.completed, w.num_requests);
  int64_t prompt_tokens = 0;
  for (const Request& q : reqs.value()) prompt_tokens += static_cast<int64_t>(q.prompt.size());
  const int64_t shared = (w.system_prompt_len / c.block_size) * c.block_size;
  const double expected =
      static_cast<double>(shared * (w.num_requests - 1)) / static_cast<double>(prompt_tokens);
  const double actual = static_cast<double>(r.stats.prefix_hit_tokens) /
                        static_cast<double>(r.stats.prefix_query_tokens);
  EXPECT_NEAR(actual, expected, 0.01);
  EXPECT_EQ(r.stats.prefix_hit_blocks + r.stats.prefix_miss_blocks, r.lookup_blocks);
}

// A device pool far smaller than the working set: the cache offloads inactive sequences to the
// host and restores them, and every request still completes.
TEST(Simulation, HostTierAbsorbsADevicePoolOverflow) {
  WorkloadConfig w;
  w.num_requests = 40;
  w.arrival_rate = 200;
  w.prompt_mean = 200;
  w.prompt_max = 300;
  w.output_mean = 48;
  w.output_max = 64;
  w.system_prompt_share = 0.5;
  w.multi_turn_share = 0;  // every request fits the small device pool on its own
  auto reqs = generate_workload(w);
  ASSERT_OK(reqs);
  SchedulerConfig s;
  s.max_batch = 4;
  s.max_running = 16;
  for (bool data : {true, false}) {
    const SimResult r = run_or_die(reqs.value(), small_config(64, 512), s, data);
    EXPECT_EQ(r.completed, w.num_requests) << "data " << data;
    EXPECT_EQ(r.rejected, 0);
    EXPECT_GT(r.stats.blocks_offloaded, 0) << "data " << data;
    EXPECT_GT(r.stats.blocks_restored, 0) << "data " << data;
    EXPECT_GT(r.output_tokens, 0);
  }
}

// Six system prompts of 16 blocks each take more than the 64-block device pool: their cached
// blocks are pushed out between uses. With a host tier they are demoted there and later prompts
// hit them on the host (the report's host hit rate is > 0); without one, or with demotion off,
// they are dropped and recomputed.
TEST(Simulation, HostTierServesPrefixHitsUnderDevicePressure) {
  WorkloadConfig w;
  w.num_requests = 80;
  w.arrival_rate = 20;
  w.system_prompts = 6;
  w.system_prompt_len = 256;
  w.system_prompt_share = 1;
  w.prompt_mean = 40;
  w.output_mean = 16;
  w.multi_turn_share = 0;
  w.parallel_share = 0;
  w.speculative_share = 0;
  auto reqs = generate_workload(w);
  ASSERT_OK(reqs);
  SchedulerConfig s;
  s.max_batch = 2;
  s.max_running = 2;
  auto host_rate = [](const CacheConfig& c, const SimResult& r) {
    const nlohmann::json j = report_json(c, SchedulerConfig{}, RunInfo{}, r);
    const auto& p = j["prefix"];
    EXPECT_EQ(p["host_hit_blocks"].get<int64_t>(), r.stats.prefix_host_hit_blocks);
    EXPECT_EQ(j["host_prefix_cache"]["demoted_blocks"].get<int64_t>(), r.stats.blocks_demoted);
    EXPECT_EQ(j["host_prefix_cache"]["dropped_blocks"].get<int64_t>(), r.stats.host_blocks_dropped);
    EXPECT_NEAR(
        p["host_hit_rate"].get<double>(),
        static_cast<double>(r.stats.prefix_host_hit_blocks) / static_cast<double>(r.lookup_blocks),
        1e-12);
    return p["host_hit_rate"].get<double>();
  };
  for (bool data : {true, false}) {
    const CacheConfig with_host = small_config(64, 256);
    const SimResult r = run_or_die(reqs.value(), with_host, s, data);
    EXPECT_EQ(r.completed, w.num_requests);
    EXPECT_GT(r.stats.blocks_demoted, 0) << "data " << data;
    EXPECT_GT(host_rate(with_host, r), 0.0) << "data " << data;

    const CacheConfig no_host = small_config(64, 0);
    const SimResult n = run_or_die(reqs.value(), no_host, s, data);
    EXPECT_EQ(n.completed, w.num_requests);
    EXPECT_EQ(n.stats.blocks_demoted, 0);
    EXPECT_EQ(host_rate(no_host, n), 0.0) << "data " << data;
    EXPECT_GT(n.stats.blocks_evicted, 0) << "the prefixes were dropped instead";
    EXPECT_GT(r.stats.prefix_hit_tokens, n.stats.prefix_hit_tokens)
        << "the host tier's hits are hits the device alone misses";

    CacheConfig off = with_host;
    off.cache_prefixes_on_host = false;
    const SimResult o = run_or_die(reqs.value(), off, s, data);
    EXPECT_EQ(o.completed, w.num_requests);
    EXPECT_EQ(o.stats.blocks_demoted, 0);
    EXPECT_GT(o.stats.blocks_evicted, 0);
    EXPECT_LT(host_rate(off, o), host_rate(with_host, r)) << "data " << data;
  }
}

// Speculative decoding rolls back rejected drafts; parallel sampling forks; both complete.
TEST(Simulation, SpeculativeAndParallelRequestsComplete) {
  WorkloadConfig w;
  w.num_requests = 30;
  w.parallel_share = 0.5;
  w.speculative_share = 0.5;
  w.multi_turn_share = 0.5;
  auto reqs = generate_workload(w);
  ASSERT_OK(reqs);
  const SimResult r = run_or_die(reqs.value(), small_config(512, 256), SchedulerConfig{});
  EXPECT_EQ(r.completed, w.num_requests);
  EXPECT_GT(r.forks, 0);
  EXPECT_GT(r.rollbacks, 0);
  EXPECT_GT(r.rejected_tokens, 0);
  int64_t expected_output = 0;
  for (const Request& q : reqs.value()) expected_output += int64_t{q.output_len} * q.samples;
  EXPECT_EQ(r.output_tokens, expected_output);
}

// Runs the command line in-process.
int cli(std::vector<std::string> args, std::string* out, std::string* err) {
  args.insert(args.begin(), "pagedkv-sim");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream o, e;
  const int rc = run_cli(static_cast<int>(argv.size()), argv.data(), o, e, false);
  *out = o.str();
  *err = e.str();
  return rc;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "pagedkv_sim_" + name;
}

// A window beside a full-attention group, two full-attention groups of different shapes, and
// two windows (the wider owning the blocks) share the logical blocks of one cache, and a
// workload runs on it with data and without, each group counted in its own pages.
TEST(Simulation, EveryGroupShapeRunsOnOneCache) {
  auto two_groups = [](int32_t window_a, int32_t window_b) {
    CacheConfig c = small_config(0, 0);
    KvGroup a, b;
    a.name = "a";
    a.layers = {0};
    a.num_kv_heads = 2;
    a.sliding_window = window_a;
    b.name = "b";
    b.layers = {1};
    b.num_kv_heads = 1;
    b.sliding_window = window_b;
    for (KvGroup* g : {&a, &b}) {
      g->head_dim = 32;
      g->num_device_blocks = 128;
      g->num_host_blocks = 256;
    }
    c.groups = {a, b};
    return c;
  };
  WorkloadConfig w;
  w.num_requests = 30;
  w.prompt_mean = 100;
  w.output_mean = 16;
  auto reqs = generate_workload(w);
  ASSERT_OK(reqs);
  const std::pair<int32_t, int32_t> shapes[] = {{64, 0}, {0, 0}, {64, 32}};
  for (const auto& [window_a, window_b] : shapes) {
    SCOPED_TRACE("windows " + std::to_string(window_a) + ", " + std::to_string(window_b));
    const CacheConfig c = two_groups(window_a, window_b);
    ASSERT_OK(make_model_cache(c));
    for (bool data : {true, false}) {
      auto engine = data ? make_cache_engine(c, 256) : make_no_data_engine(c);
      ASSERT_OK(engine);
      EXPECT_EQ((*engine)->has_data(), data);
      const SimResult r = run_or_die(reqs.value(), c, SchedulerConfig{}, data);
      EXPECT_EQ(r.completed, w.num_requests) << "data " << data;
      ASSERT_EQ(r.group_stats.size(), 2u) << "counted per group";
      // Group a holds its own pages: at most its pool, and with a window fewer than group b's
      // blocks were at their peak of use.
      EXPECT_EQ(r.group_stats[0].device.total_blocks, 128);
      EXPECT_GT(r.group_stats[0].prefix_hit_blocks + r.group_stats[0].prefix_miss_blocks, 0);
      EXPECT_EQ(r.group_stats[0].window_released_blocks > 0, window_a > 0);
      EXPECT_EQ(r.group_stats[1].window_released_blocks > 0, window_b > 0);
    }
  }
}

TEST(Cli, JsonReportParsesAndIsConsistent) {
  std::string out, err;
  const std::string timeline = temp_path("timeline.csv"), plot = temp_path("plot.svg");
  ASSERT_EQ(cli({"--json", "--requests", "80", "--device-blocks", "96", "--host-blocks", "256",
                 "--backend", "cpu", "--check-invariants", "--timeline", timeline, "--plot", plot},
                &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);  // throws (fails the test) if malformed
  EXPECT_EQ(j["requests"]["completed"].get<int64_t>() + j["requests"]["rejected"].get<int64_t>(),
            j["requests"]["total"].get<int64_t>());
  EXPECT_EQ(j["requests"]["total"].get<int64_t>(), 80);
  const auto& p = j["prefix"];
  EXPECT_EQ(p["hit_blocks"].get<int64_t>() + p["miss_blocks"].get<int64_t>(),
            p["lookup_blocks"].get<int64_t>());
  EXPECT_LE(p["hit_tokens"].get<int64_t>(), p["lookup_tokens"].get<int64_t>());
  // The host tier is a prefix cache: its share of the hits is reported (docs/pagedkv-sim.md).
  EXPECT_GE(p["host_hit_blocks"].get<int64_t>(), 0);
  EXPECT_NEAR(p["host_hit_rate"].get<double>(),
              static_cast<double>(p["host_hit_blocks"].get<int64_t>()) /
                  static_cast<double>(p["lookup_blocks"].get<int64_t>()),
              1e-12);
  EXPECT_NEAR(p["block_hit_rate"].get<double>(),
              static_cast<double>(p["hit_blocks"].get<int64_t>()) /
                  static_cast<double>(p["lookup_blocks"].get<int64_t>()),
              1e-12);
  EXPECT_LE(p["device_hit_blocks"].get<int64_t>(), p["hit_blocks"].get<int64_t>());
  const auto& hc = j["host_prefix_cache"];
  EXPECT_TRUE(hc["demotion"].get<bool>());
  EXPECT_EQ(hc["hit_blocks"], p["host_hit_blocks"]);
  EXPECT_EQ(hc["demoted_bytes"].get<int64_t>(),
            hc["demoted_blocks"].get<int64_t>() * j["model"]["block_bytes"].get<int64_t>());
  for (const char* tier : {"device", "host"}) {
    const auto& b = j["blocks"][tier];
    EXPECT_LE(b["peak"].get<int64_t>(), b["capacity"].get<int64_t>()) << tier;
    EXPECT_LE(b["mean"].get<double>(), b["peak"].get<double>()) << tier;
    EXPECT_LE(b["peak_referenced"].get<int64_t>(), b["peak"].get<int64_t>()) << tier;
  }
  const int64_t bb = j["model"]["block_bytes"].get<int64_t>();
  EXPECT_EQ(j["offloads"]["bytes"].get<int64_t>(), j["offloads"]["blocks"].get<int64_t>() * bb);
  EXPECT_EQ(j["restores"]["bytes"].get<int64_t>(), j["restores"]["blocks"].get<int64_t>() * bb);
  EXPECT_TRUE(j["data"].get<bool>());

  // One CSV row per step, after the header.
  std::ifstream csv(timeline);
  std::string line;
  int64_t rows = -1;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, j["time"]["steps"].get<int64_t>());
  std::ifstream svg(plot);
  std::stringstream svg_text;
  svg_text << svg.rdbuf();
  EXPECT_EQ(svg_text.str().rfind("<svg", 0), 0u);
  EXPECT_NE(svg_text.str().find("<polyline"), std::string::npos);
}

// --no-data plans a full-size model without allocating its pools.
TEST(Cli, NoDataPlansAFullSizeModel) {
  std::string out, err;
  ASSERT_EQ(cli({"--no-data", "--json", "--model", "llama3-70b", "--device-gib", "40", "--host-gib",
                 "200", "--requests", "100", "--rate", "50"},
                &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["data"].get<bool>());
  EXPECT_EQ(j["model"]["layers"].get<int>(), 80);
  // 80 layers x 2 x 16 tokens x 8 heads x 128 dims x 2 bytes = 5 MiB per block.
  EXPECT_EQ(j["model"]["block_bytes"].get<int64_t>(), 5 * 1048576);
  EXPECT_EQ(j["pools"]["device_blocks"].get<int64_t>(), 40 * 1024 / 5);
  EXPECT_EQ(j["requests"]["completed"].get<int64_t>(), 100);
}

// The text report gives the host tier's share of the prefix hits and its demoted and dropped
// blocks; without a host tier the share is 0, and --no-host-prefix-cache turns demotion off.
// The run without a host tier also covers a scheduler fix: a sequence the cache dropped during
// a step's reserves was once chosen as a preemption victim (erase: "sequence N does not exist").
TEST(Cli, TextReportShowsTheHostTierHitRate) {
  std::string out, err;
  const std::vector<std::string> common = {"--no-data", "--requests", "150", "--device-blocks",
                                           "96"};
  std::vector<std::string> a = common;
  ASSERT_EQ(cli(a, &out, &err), 0) << err;
  EXPECT_EQ(out.find("n/a"), std::string::npos) << out;
  EXPECT_NE(out.find("of full blocks: device "), std::string::npos) << out;
  EXPECT_NE(out.find("cached blocks demoted from the device"), std::string::npos) << out;
  EXPECT_EQ(out.find("host 0.0% (0 blocks)"), std::string::npos) << "pressure gives host hits";

  a.insert(a.end(), {"--host-blocks", "0"});
  ASSERT_EQ(cli(a, &out, &err), 0) << err;
  EXPECT_NE(out.find("host 0.0% (0 blocks)"), std::string::npos) << out;
  EXPECT_NE(out.find("host cache       no host tier"), std::string::npos) << out;

  std::vector<std::string> b = common;
  b.insert(b.end(), {"--no-host-prefix-cache", "--json"});
  ASSERT_EQ(cli(b, &out, &err), 0) << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["host_prefix_cache"]["demotion"].get<bool>());
  EXPECT_EQ(j["host_prefix_cache"]["demoted_blocks"].get<int64_t>(), 0);
}

TEST(Cli, AStorageTierKeepsPrefixesAcrossRuns) {
  const std::string dir = temp_path("storage_dir");
  const std::string empty_dir = temp_path("storage_dir_empty");
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(empty_dir);
  const auto args_for = [](const std::string& requests, const std::string& storage) {
    return std::vector<std::string>{
        "--json", "--backend",     "cpu", "--requests",         requests,        "--device-blocks",
        "96",     "--host-blocks", "32",  "--check-invariants", "--storage-dir", storage};
  };
  std::string out, err;
  ASSERT_EQ(cli(args_for("150", dir), &out, &err), 0) << err;
  const nlohmann::json first = nlohmann::json::parse(out)["stats"];
  EXPECT_GT(first["host_blocks_dropped"].get<int64_t>(), 0) << "the workload must fill the host";
  EXPECT_GT(first["storage_blocks_written"].get<int64_t>(), 0);
  EXPECT_EQ(first["storage_failed_blocks"].get<int64_t>(), 0);
  // A short run (its first requests, too few to fill the host) hits storage only for what an
  // earlier run wrote: nothing on an empty directory, the first run's prompts on its directory.
  // Comparing whole runs instead would be timing-dependent: within a run, how many dropped blocks
  // come back from storage depends on when the write-backs land.
  ASSERT_EQ(cli(args_for("4", empty_dir), &out, &err), 0) << err;
  const nlohmann::json cold = nlohmann::json::parse(out)["stats"];
  ASSERT_EQ(cold["host_blocks_dropped"].get<int64_t>(), 0)
      << "the short run must not fill the host";
  EXPECT_EQ(cold["storage_hit_blocks"].get<int64_t>(), 0);
  ASSERT_EQ(cli(args_for("4", dir), &out, &err), 0) << err;
  const nlohmann::json warm = nlohmann::json::parse(out)["stats"];
  EXPECT_GT(warm["storage_hit_blocks"].get<int64_t>(), 0);
  EXPECT_EQ(warm["storage_failed_blocks"].get<int64_t>(), 0);
  EXPECT_EQ(warm["storage_bytes_read"].get<int64_t>() % warm["storage_hit_blocks"].get<int64_t>(),
            0);
  EXPECT_NE(cli({"--no-data", "--storage-dir", dir}, &out, &err), 0);
  EXPECT_NE(err.find("--storage-dir needs KV bytes"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(empty_dir);
}

TEST(Cli, MalformedTraceStopsWithTheLineAndNoReport) {
  const std::string path = temp_path("bad.jsonl");
  {
    std::ofstream f(path);
    f << "{\"id\": 1, \"arrival_s\": 0, \"prompt\": [5, 6, 7], \"output_len\": 2}\n"
      << "{\"id\": 2, \"arrival_s\": 0.1, \"prompt\": [5, 6], \"output_len\": 3}\n"
      << "{\"id\": 3, \"arrival_s\": 0.2, \"prompt\": [5, 6], \"output_len\": \"many\"}\n";
  }
  std::string out, err;
  EXPECT_NE(cli({"--trace", path}, &out, &err), 0);
  EXPECT_TRUE(out.empty()) << out;
  EXPECT_NE(err.find(path + ":3:"), std::string::npos) << err;
  EXPECT_NE(err.find("output_len"), std::string::npos) << err;
}

TEST(Cli, ReplaysATraceItWrote) {
  const std::string path = temp_path("workload.jsonl");
  std::string out1, out2, err;
  const std::vector<std::string> common = {"--json",    "--requests",      "40",
                                           "--no-data", "--device-blocks", "128"};
  std::vector<std::string> a = common;
  a.insert(a.end(), {"--write-trace", path});
  ASSERT_EQ(cli(a, &out1, &err), 0) << err;
  std::vector<std::string> b = common;
  b.insert(b.end(), {"--trace", path});
  ASSERT_EQ(cli(b, &out2, &err), 0) << err;
  nlohmann::json j1 = nlohmann::json::parse(out1), j2 = nlohmann::json::parse(out2);
  // Same requests, same decisions: every count matches (timings and the label differ).
  for (const char* k :
       {"requests", "sequences", "tokens", "prefix", "offloads", "restores", "stats"})
    EXPECT_EQ(j1[k], j2[k]) << k;
}

// Every count of ControlStats reaches the JSON ("stats", under its own name), the text report
// (one "counters" line each) and the timeline CSV ("stats.NAME" columns), each with its value:
// the three are generated from the field list, so a new counter cannot be left out.
TEST(Report, CarriesEveryCountOfTheStats) {
  SimResult r;
  int64_t next = 1000;
  for_each_stat(r.stats, [&next](const std::string&, int64_t& v) { v = next++; });
  StepRecord step;
  step.stats = r.stats;
  step.stats.blocks_demoted = 5;
  r.timeline.push_back(step);
  const CacheConfig c = small_config(64, 64);

  const nlohmann::json j = report_json(c, SchedulerConfig{}, RunInfo{}, r);
  std::ostringstream text;
  write_text_report(text, c, SchedulerConfig{}, RunInfo{}, r);
  const std::string path = temp_path("stats_timeline.csv");
  ASSERT_OK(write_timeline_csv(path, r));
  std::ifstream csv(path);
  std::string header, row;
  ASSERT_TRUE(std::getline(csv, header));
  ASSERT_TRUE(std::getline(csv, row));
  auto split = [](const std::string& line) {
    std::vector<std::string> out;
    std::stringstream in(line);
    for (std::string cell; std::getline(in, cell, ',');) out.push_back(cell);
    return out;
  };
  const std::vector<std::string> columns = split(header), cells = split(row);
  ASSERT_EQ(columns.size(), cells.size()) << header << "\n" << row;

  size_t count = 0;
  for_each_stat(r.stats, [&](const std::string& name, int64_t value, const char* doc) {
    ++count;
    std::string pointer = "/" + name;
    for (char& ch : pointer) ch = ch == '.' ? '/' : ch;
    const nlohmann::json::json_pointer p(pointer);
    ASSERT_TRUE(j["stats"].contains(p)) << name;
    EXPECT_EQ(j["stats"][p].get<int64_t>(), value) << name;
    char line[256];
    std::snprintf(line, sizeof line, "  %-24s %14lld  %s\n", name.c_str(),
                  static_cast<long long>(value), doc);
    EXPECT_NE(text.str().find(line), std::string::npos) << "no line: " << line;
    size_t col = 0;
    while (col < columns.size() && columns[col] != "stats." + name) ++col;
    ASSERT_LT(col, columns.size()) << name << " not in " << header;
    EXPECT_EQ(cells[col], std::to_string(name == "blocks_demoted" ? 5 : value)) << name;
  });
  EXPECT_EQ(count, kNumStats);
  // The older sections keep their keys and read the same counts.
  EXPECT_EQ(j["prefix"]["hit_blocks"], j["stats"]["prefix_hit_blocks"]);
  EXPECT_EQ(j["host_prefix_cache"]["demoted_blocks"], j["stats"]["blocks_demoted"]);
  EXPECT_EQ(j["evictions"]["cached_blocks"], j["stats"]["blocks_evicted"]);
  EXPECT_EQ(j["offloads"]["blocks"], j["stats"]["blocks_offloaded"]);
  EXPECT_EQ(j["restores"]["sequences"], j["stats"]["sequences_restored"]);
  EXPECT_EQ(j["copy_on_write"], j["stats"]["copy_on_write"]);
}

TEST(Cli, BadFlagsFailWithAMessage) {
  std::string out, err;
  EXPECT_NE(cli({"--model", "gpt-17"}, &out, &err), 0);
  EXPECT_NE(err.find("unknown model"), std::string::npos) << err;
  EXPECT_NE(cli({"--rate", "0", "--no-data"}, &out, &err), 0);
  EXPECT_NE(err.find("rate"), std::string::npos) << err;
  EXPECT_NE(cli({"--no-such-flag"}, &out, &err), 0);
}

}  // namespace
}  // namespace pagedkv::sim
