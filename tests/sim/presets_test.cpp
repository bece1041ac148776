// Model presets of pagedkv-sim: uniform, hybrid (sliding window + full attention: two KV
// groups) and MLA; the memory a sequence takes per group; the capacity a hybrid cache gains
// against the uniform cache of the same model, measured through the control planes.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "capacity.hpp"
#include "cli.hpp"
#include "model.hpp"
#include "pagedkv/cache.hpp"
#include "report.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::sim {
namespace {

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

CacheConfig preset_config(const std::string& name) {
  CacheConfig c;
  const StatusOr<ModelShape> m = find_model(name);
  EXPECT_OK(m) << name;
  EXPECT_OK(apply_model(m.value(), &c)) << name;
  return c;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

TEST(Presets, EveryPresetGivesAValidConfig) {
  for (const ModelShape& m : model_presets()) {
    CacheConfig c;
    ASSERT_OK(apply_model(m, &c)) << m.name;
    c = c.with_pools(int64_t{4} << 30, int64_t{1} << 30, 4096).value();
    EXPECT_OK(c.validate()) << m.name;
    EXPECT_EQ(c.num_groups(), m.sliding_window > 0 ? 2 : 1) << m.name;
  }
  ASSERT_OK(find_model("llama"));
  EXPECT_EQ(find_model("tiny").value().name, model_presets().front().name) << "tiny is the default";
}

// The published layer patterns: gpt-oss alternates window 128 / full from a window layer;
// Gemma 3 has a global layer after every five local ones (window 1024); DeepSeek V3 is one
// latent group of 576 = 512 + 64 per token, keys only.
TEST(Presets, HybridAndLatentPresetsHaveTheirLayerPatterns) {
  const CacheConfig oss = preset_config("gpt-oss");
  ASSERT_EQ(oss.num_groups(), 2);
  EXPECT_EQ(oss.num_layers, 36);
  for (const KvGroup& g : oss.groups) {
    EXPECT_EQ(g.layers.size(), 18u) << g.name;
    EXPECT_EQ(g.num_kv_heads, 8);
    EXPECT_EQ(g.head_dim, 64);
    EXPECT_EQ(g.sliding_window, g.name == "window" ? 128 : 0);
    EXPECT_EQ(g.layers.front(), g.name == "window" ? 0 : 1);
  }
  const CacheConfig gemma = preset_config("gemma3");
  ASSERT_EQ(gemma.num_groups(), 2);
  EXPECT_EQ(gemma.num_layers, 62);
  for (const KvGroup& g : gemma.groups) {
    EXPECT_EQ(g.layers.size(), g.name == "full" ? 10u : 52u) << g.name;
    EXPECT_EQ(g.sliding_window, g.name == "window" ? 1024 : 0);
    EXPECT_EQ(g.num_kv_heads, 16);
    EXPECT_EQ(g.head_dim, 128);
    for (int32_t layer : g.layers) EXPECT_EQ((layer + 1) % 6 == 0, g.name == "full") << layer;
  }
  const CacheConfig ds = preset_config("deepseek");
  EXPECT_TRUE(ds.groups.empty());
  EXPECT_EQ(ds.num_layers, 61);
  EXPECT_EQ(ds.kv_kind, KvKind::kLatent);
  EXPECT_EQ(ds.num_kv_heads, 1);
  EXPECT_EQ(ds.head_dim, 576);
  EXPECT_EQ(ds.rope_dim, 64);
  // One latent of 576 fp16 values per token and layer: 61 x 16 x 576 x 2 bytes per block.
  EXPECT_EQ(ds.block_bytes(), int64_t{61} * 16 * 576 * 2);
}

TEST(Presets, EveryPresetRunsAWorkload) {
  for (const ModelShape& m : model_presets()) {
    std::string out, err;
    ASSERT_EQ(
        cli({"--no-data", "--json", "--model", m.name, "--requests", "40", "--check-invariants"},
            &out, &err),
        0)
        << m.name << ": " << err;
    const nlohmann::json j = nlohmann::json::parse(out);
    EXPECT_EQ(j["requests"]["completed"].get<int64_t>() + j["requests"]["rejected"].get<int64_t>(),
              40)
        << m.name;
    EXPECT_GT(j["prefix"]["hit_tokens"].get<int64_t>(), 0) << m.name;
    EXPECT_EQ(j.contains("memory"), m.sliding_window > 0 || m.kv_kind == KvKind::kLatent) << m.name;
  }
}

TEST(Cli, AnUnknownPresetIsAClearError) {
  std::string out, err;
  EXPECT_NE(cli({"--model", "gemma4", "--no-data"}, &out, &err), 0);
  EXPECT_TRUE(out.empty()) << out;
  EXPECT_NE(err.find("unknown model 'gemma4'"), std::string::npos) << err;
  for (const ModelShape& m : model_presets())
    EXPECT_NE(err.find(m.name), std::string::npos) << "the message lists " << m.name;
  EXPECT_NE(cli({"--model", "gemma3", "--no-data", "--context", "0"}, &out, &err), 0);
  EXPECT_NE(err.find("context"), std::string::npos) << err;
}

// A model of several groups gets a storage tier: a store per group, each in its own directory.
TEST(Cli, AModelOfSeveralGroupsStoresEachGroupApart) {
  std::string out, err;
  const std::string dir = ::testing::TempDir() + "pagedkv_presets_groups";
  ASSERT_EQ(cli({"--model", "gpt-oss", "--storage-dir", dir, "--layers", "2", "--kv-heads", "1",
                 "--head-dim", "8", "--backend", "cpu", "--requests", "20", "--check-invariants"},
                &out, &err),
            0)
      << err;
  for (const char* g : {"/group0", "/group1"}) {
    struct stat st {};
    EXPECT_EQ(::stat((dir + g).c_str(), &st), 0) << dir + g;
    EXPECT_TRUE(S_ISDIR(st.st_mode)) << dir + g;
  }
}

// `--model llama` is the uniform Llama 3 8B of before the presets had groups: the same report as
// `--model llama3-8b`, no memory or capacity section, and the counts this workload gave before
// (captured from pagedkv-sim at dffd01a, the commit before the presets: a regression check).
TEST(Cli, TheLlamaPresetReproducesTodaysReport) {
  const std::vector<std::string> common = {"--no-data", "--requests", "150", "--device-blocks",
                                           "96"};
  std::string llama, llama3, err;
  std::vector<std::string> a = common, b = common;
  a.insert(a.end(), {"--model", "llama"});
  b.insert(b.end(), {"--model", "llama3-8b"});
  ASSERT_EQ(cli(a, &llama, &err), 0) << err;
  ASSERT_EQ(cli(b, &llama3, &err), 0) << err;
  // Everything but the model's name and the wall-clock figures (the lines of them, and the
  // pools' allocation times: "(192.0 MiB, 0.1 ms)" under a loaded sanitizer build).
  auto strip = [](const std::string& text) {
    static const std::regex alloc_time(", [0-9.]+ ms\\)");
    std::istringstream in(text);
    std::string out;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("  model ", 0) == 0 || line.rfind("  steps ", 0) == 0 ||
          line.rfind("  host per step", 0) == 0)
        continue;
      out += std::regex_replace(line, alloc_time, ")") + "\n";
    }
    return out;
  };
  EXPECT_EQ(strip(llama), strip(llama3));
  EXPECT_NE(llama.find("  model      llama: 32 layers x 8 KV heads x 128 dims"), std::string::npos);
  EXPECT_EQ(llama.find("memory per sequence"), std::string::npos) << llama;
  EXPECT_EQ(llama.find("capacity"), std::string::npos) << llama;
  EXPECT_EQ(llama.find("group 0"), std::string::npos) << llama;

  a.push_back("--json");
  ASSERT_EQ(cli(a, &llama, &err), 0) << err;
  const nlohmann::json j = nlohmann::json::parse(llama);
  EXPECT_FALSE(j.contains("memory"));
  EXPECT_FALSE(j.contains("capacity"));
  EXPECT_FALSE(j["model"].contains("groups"));
  EXPECT_EQ(j["model"]["block_bytes"].get<int64_t>(), 2 * 1048576);
  EXPECT_EQ(j["pools"]["device_blocks"].get<int64_t>(), 96);
  EXPECT_EQ(j["requests"]["completed"].get<int64_t>(), 149);
  EXPECT_EQ(j["sequences"]["added"].get<int64_t>(), 9600);
  EXPECT_EQ(j["sequences"]["preempted"].get<int64_t>(), 9406);
  EXPECT_EQ(j["tokens"]["prefill_computed"].get<int64_t>(), 124308);
  EXPECT_EQ(j["tokens"]["rollbacks"].get<int64_t>(), 1277);
  EXPECT_EQ(j["prefix"]["hit_tokens"].get<int64_t>(), 1928496);
  EXPECT_EQ(j["prefix"]["host_hit_blocks"].get<int64_t>(), 76759);
  EXPECT_EQ(j["offloads"]["blocks"].get<int64_t>(), 8469);
  EXPECT_EQ(j["restores"]["bytes"].get<int64_t>(), 13797163008);
  EXPECT_EQ(j["stats"]["blocks_demoted"].get<int64_t>(), 6487);
  EXPECT_EQ(j["stats"]["host_blocks_dropped"].get<int64_t>(), 2067);
}

// CacheConfig::blocks_per_sequence matches what a window cache (on the null backend) holds,
// prefilled a block at a time and then decoding token by token, and never exceeds ceil(W /
// block_size) + 1.
TEST(Capacity, AWindowGroupHoldsAtMostItsWindowPlusOneBlock) {
  for (const int32_t window : {16, 100, 128, 1024}) {
    CacheConfig c;
    c.num_layers = 1;
    c.num_kv_heads = 1;
    c.head_dim = 8;
    c.block_size = 16;
    c.sliding_window = window;
    c.num_device_blocks = 256;
    c.backend = BackendKind::kNull;  // decisions only
    KvCacheOptions options;
    options.enable_events = false;
    StatusOr<std::unique_ptr<KvCache>> made = KvCache::create(c, options);
    ASSERT_OK(made);
    KvCache* cp = made->get();
    ASSERT_OK(cp->add_sequence(1, {}));
    const int64_t bound = ceil_div(window, c.block_size) + 1;
    const TokenId token = 3;
    for (int64_t length = 0; length < 3000; ++length) {
      ASSERT_OK(cp->reserve(1, 1)) << window << " " << length;
      const auto blocks = cp->block_locations(1).value();
      const int64_t held = std::count_if(blocks.begin(), blocks.end(),
                                         [](const BlockLocation& b) { return b.block >= 0; });
      ASSERT_EQ(held, c.blocks_per_sequence(length)) << "window " << window << " at " << length;
      ASSERT_LE(held, bound) << "window " << window << " at " << length;
      ASSERT_OK(cp->commit(1, {token}));
    }
    // Far past the window: the window's blocks (ceil(W / block_size)) and, when the window does
    // not start on a block boundary or the next token opens a block, one more.
    EXPECT_GE(c.blocks_per_sequence(1 << 20), ceil_div(window, c.block_size)) << window;
    EXPECT_LE(c.blocks_per_sequence(1 << 20), bound) << window;
  }
}

// Through the simulator: prompts longer than gpt-oss's 128-token window make its window group
// release blocks, and at no step does it hold more than (window blocks + 1) per sequence plus
// what prefill chunks add.
TEST(Capacity, TheSimulatorsWindowGroupReleasesBlocks) {
  std::string out, err;
  ASSERT_EQ(cli({"--no-data", "--json", "--model", "gpt-oss", "--requests", "60", "--prompt-mean",
                 "600", "--check-invariants"},
                &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  const auto& groups = j["model"]["groups"];
  ASSERT_EQ(groups.size(), 2u);
  // One cache whose groups share the logical blocks: it counts the releases of its window
  // group, and each group's pages apart.
  EXPECT_GT(j["stats"]["window_released_blocks"].get<int64_t>(), 0) << j["stats"].dump();
  for (const auto& g : groups) {
    ASSERT_TRUE(g.contains("stats")) << g.dump();
    const int64_t released = g["stats"]["window_released_blocks"].get<int64_t>();
    EXPECT_EQ(g["stats"]["device"]["total_blocks"].get<int64_t>(),
              g["device_blocks"].get<int64_t>())
        << g.dump();
    if (g["sliding_window"].get<int64_t>() > 0) {
      EXPECT_EQ(released, j["stats"]["window_released_blocks"].get<int64_t>()) << g.dump();
    } else {
      EXPECT_EQ(released, 0) << g.dump();
    }
  }
}

// The must-show: at 32K tokens the Gemma-3-like cache holds several times the sequences
// of a uniform cache in the same memory. The expected gain comes from the layer pattern alone:
// 62 layers of 2049 blocks (32768 tokens and the next one's slot) against 10 such layers and 52
// window layers of 1024 / 16 + 1 = 65 blocks.
TEST(Capacity, Gemma3HoldsMoreThanThreeTimesTheSequencesAt32K) {
  const CacheConfig c = preset_config("gemma3");
  constexpr int64_t kContext = 32768, kBudget = int64_t{80} << 30;
  const double formula = 62.0 * (kContext / 16 + 1) / (10.0 * (kContext / 16 + 1) + 52.0 * 65);
  EXPECT_GT(formula, 3.0);
  const StatusOr<Capacity> cap = measure_capacity(c, kContext, kBudget);
  ASSERT_OK(cap);
  EXPECT_NEAR(cap->memory.gain(), formula, 1e-9);
  const int64_t per_layer_block = int64_t{16} * 16 * 128 * 2 * 2;  // tokens x heads x dim x K,V
  EXPECT_EQ(cap->memory.uniform_bytes, 62 * 2049 * per_layer_block);
  EXPECT_EQ(cap->memory.bytes, (10 * 2049 + 52 * 65) * per_layer_block);
  // Measured: the uniform cache holds what its blocks allow, the hybrid one what its split
  // pools allow (a block or two of rounding per group at most costs one sequence).
  EXPECT_EQ(cap->uniform_sequences, kBudget / cap->memory.uniform_bytes);
  EXPECT_GE(cap->sequences, kBudget / cap->memory.bytes - 1);
  EXPECT_LE(cap->sequences, kBudget / cap->memory.bytes);
  EXPECT_GT(cap->gain(), 3.0) << cap->sequences << " vs " << cap->uniform_sequences;

  // The same figure from the command line, in the text report and the JSON.
  std::string out, err;
  const std::vector<std::string> args = {"--no-data", "--model", "gemma3", "--device-gib", "80",
                                         "--context", "32768",   "8192",   "--requests",   "20"};
  ASSERT_EQ(cli(args, &out, &err), 0) << err;
  EXPECT_NE(out.find(capacity_line(cap.value())), std::string::npos) << out;
  EXPECT_NE(out.find("memory per sequence"), std::string::npos) << out;
  std::vector<std::string> json_args = args;
  json_args.push_back("--json");
  ASSERT_EQ(cli(json_args, &out, &err), 0) << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["capacity"].size(), 2u);
  EXPECT_EQ(j["capacity"][0]["sequences"].get<int64_t>(), cap->sequences);
  EXPECT_EQ(j["capacity"][0]["uniform_sequences"].get<int64_t>(), cap->uniform_sequences);
  EXPECT_GT(j["capacity"][0]["gain"].get<double>(), 3.0);
  EXPECT_GT(j["capacity"][1]["gain"].get<double>(), 1.0);
  EXPECT_LT(j["capacity"][1]["gain"].get<double>(), j["capacity"][0]["gain"].get<double>())
      << "the longer the context, the more the window saves";
}

// --tp N: each of N devices of --device-gib holds 1/N of the heads of the same blocks, so the
// deployment holds N times the sequences at a context; the run drives one control plane over N
// pools, and its decisions (the hit rate) are the one-device run's with N times the blocks. A
// latent model (whole on every rank) gains no capacity; heads that do not split are refused.
TEST(Capacity, TensorParallelRanksHoldTheirShareOfTheHeads) {
  const int64_t kGib = int64_t{40} << 30;
  const StatusOr<Capacity> one = measure_capacity(preset_config("llama"), 8192, kGib);
  ASSERT_OK(one);
  auto run = [](std::vector<std::string> args) {
    std::string out, err;
    args.push_back("--json");
    EXPECT_EQ(cli(args, &out, &err), 0) << err;
    return out.empty() ? nlohmann::json{} : nlohmann::json::parse(out);
  };
  const std::vector<std::string> base = {"--no-data",    "--model",    "llama",
                                         "--device-gib", "40",         "--context",
                                         "8192",         "--requests", "40"};
  std::vector<std::string> tp4 = base;
  tp4.insert(tp4.end(), {"--tp", "4"});
  const nlohmann::json a = run(base), b = run(tp4);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(a["capacity"][0]["sequences"].get<int64_t>(), one->sequences);
  EXPECT_EQ(b["capacity"][0]["sequences"].get<int64_t>(),
            measure_capacity(preset_config("llama"), 8192, 4 * kGib)->sequences);
  EXPECT_GE(b["capacity"][0]["sequences"].get<int64_t>(), 4 * one->sequences);
  EXPECT_NE(b["backend"].get<std::string>().find("tensor parallel over 4 ranks"),
            std::string::npos);
  // Under pressure: four devices of 0.25 GiB decide as one of 1 GiB.
  const std::vector<std::string> tight = {"--no-data", "--model",    "llama", "--requests",
                                          "120",       "--host-gib", "0.5",   "--device-gib"};
  std::vector<std::string> four = tight, single = tight;
  four.insert(four.end(), {"0.25", "--tp", "4"});
  single.push_back("1");
  const nlohmann::json c = run(four), d = run(single);
  ASSERT_FALSE(c.empty());
  ASSERT_FALSE(d.empty());
  EXPECT_GT(d["offloads"]["sequences"].get<int64_t>(), 0) << "no pressure";
  EXPECT_EQ(c["prefix"], d["prefix"]) << "the same blocks, the same decisions";
  EXPECT_EQ(c["evictions"], d["evictions"]);
  EXPECT_EQ(c["offloads"], d["offloads"]);

  std::string out, err;
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--tp", "3"});
  EXPECT_NE(cli(args, &out, &err), 0);
  EXPECT_NE(err.find("do not split"), std::string::npos) << err;
  args = {"--model", "tiny", "--requests", "5", "--tp", "2"};
  EXPECT_NE(cli(args, &out, &err), 0);
  EXPECT_NE(err.find("--no-data"), std::string::npos) << err;
  const std::vector<std::string> mla = {"--no-data",    "--model",    "deepseek",
                                        "--device-gib", "40",         "--context",
                                        "8192",         "--requests", "10"};
  std::vector<std::string> mla_tp = mla;
  mla_tp.insert(mla_tp.end(), {"--tp", "4"});
  EXPECT_EQ(run(mla)["capacity"][0]["sequences"], run(mla_tp)["capacity"][0]["sequences"]);
}

// Full attention everywhere (llama) or MLA alone (deepseek) gains nothing against itself.
TEST(Capacity, AUniformModelGainsNothing) {
  for (const char* name : {"llama", "deepseek"}) {
    const StatusOr<Capacity> cap = measure_capacity(preset_config(name), 8192, int64_t{40} << 30);
    ASSERT_OK(cap) << name;
    EXPECT_EQ(cap->sequences, cap->uniform_sequences) << name;
    EXPECT_GT(cap->sequences, 0) << name;
    EXPECT_DOUBLE_EQ(cap->memory.gain(), 1.0) << name;
  }
}

// With KV bytes (ModelKvCache on the CPU backend) and without, a hybrid model with speculative
// decoding (drafts rejected across a window's block boundary), parallel sampling and multi-turn
// conversations completes; so does an MLA model, whose writes are keys only.
TEST(Presets, SmallHybridAndLatentModelsRunWithData) {
  for (const bool data : {true, false}) {
    std::string out, err;
    std::vector<std::string> args = {"--json", "--model",       "gpt-oss", "--layers",
                                     "4",      "--kv-heads",    "1",       "--head-dim",
                                     "8",      "--backend",     "cpu",     "--requests",
                                     "60",     "--spec-share",  "0.5",     "--device-blocks",
                                     "96",     "--host-blocks", "128",     "--check-invariants"};
    if (!data) args.push_back("--no-data");
    ASSERT_EQ(cli(args, &out, &err), 0) << "data " << data << ": " << err;
    nlohmann::json j = nlohmann::json::parse(out);
    EXPECT_EQ(j["requests"]["completed"].get<int64_t>(), 60) << data;
    EXPECT_GT(j["tokens"]["rollbacks"].get<int64_t>(), 0) << data;
    EXPECT_EQ(j["data"].get<bool>(), data);

    args = {"--json",    "--model", "deepseek",   "--layers", "2",
            "--backend", "cpu",     "--requests", "30",       "--check-invariants"};
    if (!data) args.push_back("--no-data");
    ASSERT_EQ(cli(args, &out, &err), 0) << "data " << data << ": " << err;
    j = nlohmann::json::parse(out);
    EXPECT_EQ(j["requests"]["completed"].get<int64_t>(), 30);
    EXPECT_EQ(j["model"]["kind"], "latent");
  }
}

}  // namespace
}  // namespace pagedkv::sim
