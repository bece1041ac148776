// The scenario of the fault-injection sweeps (fault_injection_test.cpp): a KvCache on a backend
// wrapped by FaultInjectionBackend runs a fixed workload (shared prefixes, copy-on-write after
// fork, offload under memory pressure, explicit offload and restore, gather, build_batch,
// rollback, finish and prefix reuse; or the storage workload), with the n-th call of one fault
// kind failing. Every cache call is one step: an injected fault must come back from it as
// kInternal and leave the control plane as it was (ControlSnapshot), so that a retry succeeds;
// check_invariants() holds after every call; every gather reads back the bytes of the model
// (kv_model.hpp) for the sequence's token list.
//
// The config may have several KV groups (CacheConfig::groups): each model layer is written and
// read with its group's row shape, a sliding-window group is read over its window only (and a
// position before its first held page must be refused with kOutOfRange), the batch is
// build_batches' one per group, and the snapshot holds every group's block locations and
// group_stats.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {

inline constexpr size_t kMaxProblemsPerRun = 6;

/// The one-group config of the scenario.
inline CacheConfig scenario_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.block_size = 4;
  c.num_device_blocks = 10;  // small: reserve has to offload others
  c.num_host_blocks = 24;
  c.max_sequence_length = 64;
  c.dtype = DType::kFloat16;
  c.backend = BackendKind::kCpu;
  return c;
}

/// The storage scenario's one-group config: a host tier of 2 blocks, so that the host LRU drops
/// (and writes back) blocks in most reserves.
inline CacheConfig storage_scenario_config() {
  CacheConfig c = scenario_config();
  c.num_device_blocks = 8;
  c.num_host_blocks = 2;
  return c;
}

/// The scenario's config with two KV groups sharing the logical blocks: layers 0 and 2 full
/// attention (2 heads x 16), layer 1 a sliding window of 8 tokens (2 blocks; 1 head x 24), so
/// that the window group releases pages as sequences grow. The pools are as small as the
/// one-group config's, so reserve offloads under pressure; both groups have a host pool.
inline CacheConfig two_group_scenario_config() {
  CacheConfig c = scenario_config();
  c.num_layers = 3;
  KvGroup full;
  full.name = "full";
  full.layers = {0, 2};
  full.num_kv_heads = 2;
  full.head_dim = 16;
  full.num_device_blocks = 10;  // the owner group (the full group with the most device blocks)
  full.num_host_blocks = 24;
  KvGroup window;
  window.name = "window";
  window.layers = {1};
  window.num_kv_heads = 1;
  window.head_dim = 24;
  window.sliding_window = 8;
  window.num_device_blocks = 9;
  window.num_host_blocks = 16;
  c.groups = {full, window};
  return c;
}

/// The storage scenario's two-group config: host pools of 4 blocks (pages) in both groups, so
/// that the fetch brings A's 4 full blocks back and, with them, the window group's pages of the
/// hit's window (A's last blocks: with a host tier of 2 in the full group the fetch brings
/// blocks 0 and 1, whose window pages A released early and the window group evicted, so E gets
/// no hit).
inline CacheConfig two_group_storage_scenario_config() {
  CacheConfig c = two_group_scenario_config();
  c.groups[0].num_device_blocks = 8;
  c.groups[0].num_host_blocks = 4;
  c.groups[1].num_device_blocks = 7;
  c.groups[1].num_host_blocks = 4;
  return c;
}

/// What one sweep runs: the cache's config, its transfer path and which workload.
struct ScenarioSetup {
  CacheConfig config = scenario_config();
  /// KvCacheOptions::transfer_kernel_block_bytes (the default sends the scenario's small blocks
  /// through the copy kernel, 0 through batched copies).
  int64_t kernel_block_bytes = kDefaultTransferKernelBlockBytes;
  /// The storage workload, with a FileTier per group (config: a storage_*_config()).
  bool storage = false;
};

/// A backend of `kind`; on the CPU its copies lag by 20 us (a device's lag on their own).
inline std::unique_ptr<Backend> slow_copy_backend(BackendKind kind) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::microseconds(20);  // transfers really lag behind
  return make_backend(kind, options);
}

inline std::string describe(const LiveObjects& l) {
  return std::to_string(l.device_allocations) + " device allocations, " +
         std::to_string(l.pinned_allocations) + " pinned allocations, " +
         std::to_string(l.streams) + " streams, " + std::to_string(l.events) + " events";
}

/// What one run of the scenario saw.
struct RunReport {
  std::string fault;       // the injected fault's message; "" when it never fired
  std::string fault_step;  // the scenario step whose cache call it fired in
  bool surfaced = false;   // that cache call returned it
  std::vector<std::string> problems;
  std::array<int64_t, kNumFaultKinds> counts{};
  ControlStats stats;
  std::vector<ControlStats> group_stats;  // KvCache::group_stats of each group at the end
  int64_t pressure_offloads = 0;          // sequences offloaded by reserve (not by offload())
  int64_t prefix_hit_tokens = 0;          // tokens add_sequence found cached
  int64_t verified = 0;                   // sequences whose every layer matched the model
  int64_t out_of_window_refusals = 0;     // gathers before a window group's pages: kOutOfRange
};

/// The control plane's view of the cache, read without any backend call (so taking it does not
/// change the counts): what a failed call must leave as it was.
struct ControlSnapshot {
  NamedStats stats;  // stats(), and with several groups each group_stats(g) as "group<g>.<name>"
  std::map<SequenceId, std::string> sequences;  // length, pending and each group's locations
};

inline std::string locations(const std::vector<BlockLocation>& blocks) {
  std::string out = "[";
  for (const BlockLocation& b : blocks) {
    out += b.block < 0 ? " -" : (b.tier == Tier::kDevice ? " d" : " h") + std::to_string(b.block);
  }
  return out + " ]";
}

inline ControlSnapshot snapshot(const KvCache& cache, SequenceId max_id) {
  ControlSnapshot out;
  out.stats = named_stats(cache.stats());
  const int32_t groups = cache.num_groups();
  if (groups > 1) {
    for (int32_t g = 0; g < groups; ++g) {
      auto s = cache.group_stats(g);
      if (!s.ok()) continue;
      for (const auto& [name, value] : named_stats(*s)) {
        out.stats["group" + std::to_string(g) + "." + name] = value;
      }
    }
  }
  for (SequenceId id = 1; id <= max_id; ++id) {
    if (!cache.contains(id)) continue;
    std::ostringstream os;
    os << "length " << cache.length(id).value_or(-1) << ", pending "
       << cache.pending(id).value_or(-1) << ", blocks "
       << locations(cache.block_locations(id).value_or({}));
    if (groups > 1) {
      for (int32_t g = 0; g < groups; ++g) {
        os << ", group " << g << " " << locations(cache.block_locations(id, g).value_or({}));
      }
    }
    out.sequences[id] = os.str();
  }
  return out;
}

/// The counts a failed call of the storage scenario may leave changed: the storage counters
/// (write-backs finish in the background and any later call collects them) and what a tier move
/// keeps when it is taken back: unreferenced cached blocks it evicted or dropped (with a host
/// tier of 2 blocks a reserve demotes and drops them all the time; docs/tiers.md, Failure rules),
/// and the tiers' free / cached split. Every sequence must still be exactly as it was. A group's
/// count ("group<g>.<name>") may change where the same count of the cache may.
inline bool storage_scenario_may_change(const std::string& full_name) {
  std::string name = full_name;
  if (name.rfind("group", 0) == 0 && name.find('.') != std::string::npos) {
    name = name.substr(name.find('.') + 1);
  }
  return name.rfind("storage_", 0) == 0 || name == "host_blocks_dropped" ||
         name == "blocks_evicted" || name.rfind("host.", 0) == 0 || name == "device.free_blocks" ||
         name == "device.cached_blocks" || name == "device.used_bytes";
}

/// Drops from `x` and `y` the counts of group `g` ("group<g>.<name>") that a failed call changed
/// only by evicting unreferenced cached pages, which a taken-back call keeps evicted (cache.hpp,
/// docs/tiers.md, Failure rules): blocks_evicted up by e, and the tiers' cached pages down by
/// e in all, each freed (free_blocks and used_bytes to match). Anything else is left to compare.
inline void forgive_group_evictions(int32_t g, NamedStats* x, NamedStats* y) {
  const std::string p = "group" + std::to_string(g) + ".";
  auto delta = [&](const std::string& name) { return (*y)[p + name] - (*x)[p + name]; };
  const int64_t evicted = delta("blocks_evicted");
  if (evicted <= 0) return;
  int64_t lost = 0;
  for (const char* tier : {"device.", "host."}) {
    const std::string t = tier;
    const int64_t freed = -delta(t + "cached_blocks");
    const int64_t total_blocks = (*x)[p + t + "total_blocks"];
    if (freed < 0 || delta(t + "free_blocks") != freed ||
        delta(t + "used_bytes") * total_blocks != -freed * (*x)[p + t + "total_bytes"]) {
      return;
    }
    lost += freed;
  }
  if (lost != evicted) return;
  for (const char* name :
       {"blocks_evicted", "device.cached_blocks", "device.free_blocks", "device.used_bytes",
        "host.cached_blocks", "host.free_blocks", "host.used_bytes"}) {
    x->erase(p + name);
    y->erase(p + name);
  }
}

/// "" when equal, else what changed (ignoring the counts `may_change` names, and a group's
/// evictions of unreferenced cached pages: forgive_group_evictions).
inline std::string diff(const ControlSnapshot& a, const ControlSnapshot& b,
                        bool (*may_change)(const std::string&) = nullptr) {
  std::ostringstream os;
  NamedStats x = a.stats, y = b.stats;
  for (int32_t g = 0; x.count("group" + std::to_string(g) + ".blocks_evicted") != 0; ++g) {
    forgive_group_evictions(g, &x, &y);
  }
  if (may_change != nullptr) {
    for (auto it = x.begin(); it != x.end();) {
      if (may_change(it->first)) {
        y.erase(it->first);
        it = x.erase(it);
      } else {
        ++it;
      }
    }
  }
  os << stats_diff(x, y);
  for (const auto& [id, was] : a.sequences) {
    auto it = b.sequences.find(id);
    if (it == b.sequences.end()) {
      os << " seq " << id << " vanished;";
    } else if (it->second != was) {
      os << " seq " << id << ": {" << was << "} -> {" << it->second << "};";
    }
  }
  for (const auto& [id, now] : b.sequences) {
    if (a.sequences.count(id) == 0) os << " seq " << id << " appeared {" << now << "};";
  }
  return os.str();
}

class FaultScenario {
 public:
  // Fault-free when n == 0.
  FaultScenario(BackendKind backend, FaultKind kind, int64_t n, ScenarioSetup setup = {})
      : backend_kind_(backend),
        kind_(kind),
        n_(n),
        kernel_block_bytes_(setup.kernel_block_bytes),
        storage_(setup.storage),
        rng_(20240611),
        config_(std::move(setup.config)) {
    for (int32_t g = 0; g < config_.num_groups(); ++g) {
      group_configs_.push_back(config_.group_config(g));
    }
    layer_groups_ = config_.layer_groups();
  }

  RunReport run() {
    inner_ = slow_copy_backend(backend_kind_);
    if (inner_ == nullptr) {
      report_.problems.push_back("no backend of the test's kind");
      return report_;
    }
    fi_ = std::make_unique<FaultInjectionBackend>(*inner_);
    if (n_ > 0) fi_->fail_nth(kind_, n_);
    int64_t row_bytes = 0;  // of the widest group
    for (const CacheConfig& c : group_configs_) {
      row_bytes = std::max<int64_t>(row_bytes, int64_t{c.num_kv_heads} * c.head_dim * 2);
    }
    const size_t bytes =
        static_cast<size_t>(config_.num_layers * config_.max_sequence_length * row_bytes);
    in_k_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    in_v_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    out_k_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    out_v_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    if (storage_ && !open_stores()) return report_;
    if (storage_) {
      storage_scenario();
    } else {
      scenario();
    }
    for (int k = 0; k < kNumFaultKinds; ++k) {
      report_.counts[static_cast<size_t>(k)] = fi_->count(static_cast<FaultKind>(k));
    }
    if (cache_ != nullptr) {
      report_.stats = cache_->stats();
      for (int32_t g = 0; g < cache_->num_groups(); ++g) {
        report_.group_stats.push_back(cache_->group_stats(g).value_or(ControlStats{}));
      }
    }
    const int64_t injected_before_destroy = fi_->injected();
    cache_.reset();
    stores_.clear();
    for (const std::string& dir : store_dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    if (fi_->injected() != injected_before_destroy && report_.fault_step.empty()) {
      report_.fault_step = "~KvCache";
    }
    if (fi_->live() != LiveObjects{}) {
      problem("after ~KvCache the cache still holds " + describe(fi_->live()));
    }
    if (report_.fault.empty()) report_.fault = fi_->last_fault();
    out_v_.reset();
    out_k_.reset();
    in_v_.reset();
    in_k_.reset();
    fi_.reset();
    inner_.reset();
    return report_;
  }

 private:
  // ---- the scenario ----

  void scenario() {
    if (!create()) return;
    const std::vector<TokenId> system = tokens(8);  // two full blocks, shared by A and B
    constexpr SequenceId kA = 1, kB = 2, kC = 3, kD = 4, kE = 5;

    add(kA, concat(system, tokens(3)), "A: prompt");
    add(kB, concat(system, tokens(4)), "B: prompt (prefix hit)");
    if (step("fork A->C", [&] { return cache_->fork(kA, kC); })) model_[kC] = model_[kA];
    extend(kA, tokens(2), "A: extend after fork (copy-on-write)");
    extend(kC, tokens(3), "C: extend after fork");
    verify(kA, "A: mid gather");
    verify(kC, "C: mid gather");

    const std::vector<TokenId> d_prompt = tokens(14);
    const int64_t offloaded_before = stats().sequences_offloaded;
    add(kD, d_prompt, "D: prompt under memory pressure");
    report_.pressure_offloads = stats().sequences_offloaded - offloaded_before;

    offload_and_restore(kC, "C");
    if (step("offload A", [&] { return cache_->offload(kA); })) {
      extend(kA, tokens(1), "A: extend while offloaded (reserve restores)");
    }

    std::vector<SequenceId> batch;
    for (SequenceId id : {kA, kC, kD}) {
      // A failed offload whose retry failed too may have left C or A on the host.
      if (model_.count(id) != 0 && on_device(id)) batch.push_back(id);
    }
    extend(kD, tokens(2), "D: extend with build_batch", batch);

    std::vector<TokenId> a_more = tokens(3);
    if (model_.count(kA) != 0) {
      const int64_t length = rollback_length(kA, 5);
      if (step("rollback A to " + std::to_string(length),
               [&] { return cache_->rollback(kA, length); })) {
        model_[kA].resize(static_cast<size_t>(length));
      }
      extend(kA, a_more, "A: extend after rollback (into a cached block)");
    }

    verify(kD, "D: gather before finish");
    if (model_.count(kD) != 0 && step("finish D", [&] { return cache_->finish(kD); })) {
      model_.erase(kD);
    }
    add(kE, concat(std::vector<TokenId>(d_prompt.begin(), d_prompt.begin() + 8), tokens(3)),
        "E: prompt (prefix hit on finished D)");
    verify(kB, "B: gather before erase (restores it)");
    if (model_.count(kB) != 0 && step("erase B", [&] { return cache_->erase(kB); })) {
      model_.erase(kB);
    }

    // The end state must read back exactly and the cache must keep working.
    for (auto it = model_.begin(); it != model_.end() && !stopped_; ++it) {
      verify(it->first, "final gather of " + name(it->first));
    }
    std::vector<SequenceId> live;
    for (const auto& [id, t] : model_) live.push_back(id);
    for (SequenceId id : live) extend(id, tokens(1), "after: extend " + name(id));
    for (SequenceId id : live) verify(id, "after: gather " + name(id));
  }

  // A prompt of 4 full blocks (A), then six others of the same length, each finished: with 8
  // device and 2 host blocks A's blocks are demoted to the host and dropped to storage, often
  // within one reserve. Then A's prompt is fetched back from storage, and E hits it.
  void storage_scenario() {
    if (!create()) return;
    constexpr SequenceId kA = 1, kE = 5;
    const std::vector<TokenId> prompt = tokens(17);
    add(kA, prompt, "A: prompt");
    if (model_.count(kA) != 0 && step("finish A", [&] { return cache_->finish(kA); })) {
      model_.erase(kA);
    }
    for (int i = 0; i < 6 && !stopped_; ++i) {
      const SequenceId id = 2 + i % 3;
      add(id, tokens(17), "pressure " + std::to_string(i) + ": prompt");
      if (model_.count(id) != 0 &&
          step("pressure " + std::to_string(i) + ": finish", [&] { return cache_->finish(id); })) {
        model_.erase(id);
      }
    }
    step("flush_storage", [&] { return cache_->flush_storage(); });
    step("fetch A's prompt from storage",
         [&] { return cache_->fetch_from_storage(prompt).status(); });
    step("flush_storage after the fetch", [&] { return cache_->flush_storage(); });
    add(kE, prompt, "E: A's prompt (a hit read back from storage)");
    verify(kE, "E: gather");
    extend(kE, tokens(2), "E: extend");
    verify(kE, "E: gather after extend");
  }

  // One FileTier per group, each in its own directory with its own model id.
  bool open_stores() {
    for (int32_t g = 0; g < config_.num_groups(); ++g) {
      char tmpl[] = "/tmp/pagedkv-fault-store-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) {
        problem("mkdtemp failed");
        return false;
      }
      store_dirs_.emplace_back(tmpl);
      FileTierOptions fo;
      fo.directory = store_dirs_.back();
      const std::string model_id =
          config_.groups.empty() ? "fault-model" : "fault-model/" + config_.groups[size_t(g)].name;
      auto store = make_file_tier(StorageLayout::from_config(gconf(g), model_id), fo);
      if (!store.ok()) {
        problem("make_file_tier: " + store.status().to_string());
        return false;
      }
      stores_.push_back(std::move(store).value());
    }
    return true;
  }

  bool create() {
    KvCacheOptions options;
    options.backend = fi_.get();
    options.transfer_kernel_block_bytes = kernel_block_bytes_;
    if (config_.groups.empty()) {
      options.storage = stores_.empty() ? nullptr : stores_[0].get();
    } else {
      for (const auto& s : stores_) options.group_storage.push_back(s.get());
    }
    return step("create", [&] {
      auto c = KvCache::create(config_, options);
      if (!c.ok()) {
        if (fi_->live() != LiveObjects{}) {
          problem("create failed (" + c.status().to_string() + ") and left " +
                  describe(fi_->live()));
        }
        return c.status();
      }
      cache_ = std::move(c).value();
      return ok_status();
    });
  }

  void add(SequenceId id, const std::vector<TokenId>& prompt, const std::string& what) {
    int64_t cached = 0;
    if (!step(what + ": add_sequence", [&] {
          auto r = cache_->add_sequence(id, prompt);
          if (r.ok()) cached = *r;
          return r.status();
        })) {
      return;
    }
    report_.prefix_hit_tokens += cached;
    model_[id] = std::vector<TokenId>(prompt.begin(), prompt.begin() + cached);
    extend(id, std::vector<TokenId>(prompt.begin() + cached, prompt.end()), what);
  }

  // Reserves, (optionally builds a batch,) writes every layer and commits `t` after the
  // sequence's committed tokens; the model follows the commit.
  void extend(SequenceId id, const std::vector<TokenId>& t, const std::string& what,
              const std::vector<SequenceId>& batch = {}) {
    if (model_.count(id) == 0 || t.empty() || stopped_) return;
    const int64_t n = static_cast<int64_t>(t.size());
    if (!step(what + ": reserve " + std::to_string(n),
              [&] { return cache_->reserve(id, n).status(); })) {
      return;
    }
    if (!batch.empty()) check_batch(batch, what);
    const int64_t start = static_cast<int64_t>(model_[id].size());
    std::vector<uint16_t> k, v;   // [layers][n, heads, dim], each layer in its group's shape
    std::vector<size_t> offsets;  // of each layer, in bytes
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      offsets.push_back(k.size() * 2);
      const std::vector<uint16_t> lk = model_rows(lconf(l), l, 0, t, start);
      const std::vector<uint16_t> lv = model_rows(lconf(l), l, 1, t, start);
      k.insert(k.end(), lk.begin(), lk.end());
      v.insert(v.end(), lv.begin(), lv.end());
    }
    upload(*in_k_, k);
    upload(*in_v_, v);
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const size_t offset = offsets[static_cast<size_t>(l)];
      if (!step(what + ": write_kv layer " + std::to_string(l), [&] {
            return cache_->write_kv(id, l, static_cast<char*>(in_k_->data()) + offset,
                                    static_cast<char*>(in_v_->data()) + offset, DType::kFloat16);
          })) {
        return;
      }
    }
    if (step(what + ": commit", [&] { return cache_->commit(id, t); })) {
      model_[id].insert(model_[id].end(), t.begin(), t.end());
    }
  }

  // The length `id` rolls back to: `back` tokens shorter, or the shortest length every window
  // group still holds the window of (ControlPlane::rollback refuses a shorter one). One group
  // without a window: length - back.
  int64_t rollback_length(SequenceId id, int64_t back) const {
    int64_t length = static_cast<int64_t>(model_.at(id).size()) - back;
    for (int32_t g = 0; g < config_.num_groups(); ++g) {
      const int32_t window = gconf(g).sliding_window;
      const int64_t first = first_held_block(id, g);
      if (window > 0 && first > 0) {
        length = std::max(length, first * config_.block_size + window);
      }
    }
    return length;
  }

  void offload_and_restore(SequenceId id, const std::string& who) {
    if (model_.count(id) == 0) return;
    if (!step("offload " + who, [&] { return cache_->offload(id); })) return;
    step("restore " + who, [&] { return cache_->restore(id); });
  }

  // Restores `id` if it is on the host, gathers every layer (a window group's from the first
  // position of its window) and compares it with the model.
  void verify(SequenceId id, const std::string& what) {
    if (model_.count(id) == 0 || stopped_) return;
    if (!step(what + ": residency", [&] { return cache_->residency(id).status(); })) return;
    // A failed restore whose retry also failed may still have moved the blocks: read what is
    // on the device anyway.
    if (!on_device(id)) step(what + ": restore", [&] { return cache_->restore(id); });
    if (model_.count(id) == 0 || !on_device(id) || stopped_) return;
    const std::vector<TokenId>& model = model_[id];
    const int64_t n = static_cast<int64_t>(model.size());
    if (n == 0) return;
    bool all_match = true;
    for (int32_t l = 0; l < config_.num_layers && !stopped_; ++l) {
      const int32_t g = layer_groups_[static_cast<size_t>(l)].group;
      const int64_t begin = window_begin(g, n);
      poison(*out_k_);
      poison(*out_v_);
      if (!step(what + ": gather_layer " + std::to_string(l), [&] {
            return cache_->gather_layer(id, l, out_k_->data(), out_v_->data(), DType::kFloat16,
                                        PackedLayout::kTokenMajor, begin);
          })) {
        return;
      }
      if (!step(what + ": synchronize", [&] { return cache_->synchronize(); })) return;
      const size_t elems =
          static_cast<size_t>((n - begin) * lconf(l).num_kv_heads * lconf(l).head_dim);
      const std::vector<uint16_t> k = download(*out_k_, elems), v = download(*out_v_, elems);
      all_match = compare(id, l, model, begin, k, v, what) && all_match;
      all_match = released_refused(id, l, what) && all_match;
    }
    if (all_match) ++report_.verified;
  }

  // A window group's layer: a gather of the last position before the group's first held page
  // is refused with kOutOfRange, before any backend call. True when there is none or it is.
  bool released_refused(SequenceId id, int32_t layer, const std::string& what) {
    const int32_t g = layer_groups_[static_cast<size_t>(layer)].group;
    const int64_t first = first_held_block(id, g);
    if (first <= 0) return true;
    const int64_t pos = first * config_.block_size - 1;
    const int64_t injected = fi_->injected();
    const std::array<int64_t, kNumFaultKinds> before = counts();
    const Status s = cache_->gather_layer(id, layer, out_k_->data(), out_v_->data(),
                                          DType::kFloat16, PackedLayout::kTokenMajor, pos, 1);
    invariants(what + ": gather of released position " + std::to_string(pos));
    if (fi_->injected() != injected || counts() != before) {
      problem(what + ": the gather of released position " + std::to_string(pos) + " of layer " +
              std::to_string(layer) + " called the backend (" + s.to_string() + ")");
      return false;
    }
    if (s.code() != StatusCode::kOutOfRange) {
      problem(what + ": the gather of released position " + std::to_string(pos) + " of layer " +
              std::to_string(layer) + " gave " + s.to_string());
      return false;
    }
    ++report_.out_of_window_refusals;
    return true;
  }

  // Whether the control plane has every block (page) of `id` on the device, in every group
  // (no backend call).
  bool on_device(SequenceId id) const {
    for (int32_t g = 0; g < config_.num_groups(); ++g) {
      auto blocks =
          config_.groups.empty() ? cache_->block_locations(id) : cache_->block_locations(id, g);
      if (!blocks.ok()) return false;
      for (const BlockLocation& b : *blocks) {
        if (b.block >= 0 && b.tier != Tier::kDevice) return false;
      }
    }
    return true;
  }

  // Compares one gathered layer (positions begin..) with the model; one problem naming the
  // wrong positions.
  bool compare(SequenceId id, int32_t layer, const std::vector<TokenId>& model, int64_t begin,
               const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
               const std::string& what) {
    const int64_t n = static_cast<int64_t>(model.size());
    const int32_t heads = lconf(layer).num_kv_heads, dim = lconf(layer).head_dim;
    std::vector<int64_t> wrong;
    std::string first;
    for (int64_t t = begin; t < n; ++t) {
      bool bad = false;
      for (int32_t h = 0; h < heads; ++h)
        for (int32_t d = 0; d < dim; ++d) {
          const size_t i = static_cast<size_t>(((t - begin) * heads + h) * dim + d);
          const TokenId tok = model[static_cast<size_t>(t)];
          for (int part = 0; part < 2; ++part) {
            const uint16_t want = kv_value(t, tok, layer, part, h, d);
            const uint16_t got = part == 0 ? k[i] : v[i];
            if (got == want) continue;
            if (first.empty()) {
              first =
                  std::string(part == 0 ? "K" : "V") + "[pos " + std::to_string(t) + ", head " +
                  std::to_string(h) + ", dim " + std::to_string(d) + "] expected " +
                  std::to_string(want) + " got " + std::to_string(got) +
                  (got == kPoison ? " (0xffff: the poison, or a never-written pool block)" : "");
            }
            bad = true;
          }
        }
      if (bad) wrong.push_back(t);
    }
    if (wrong.empty()) return true;
    std::ostringstream os;
    os << what << ": seq " << id << " (" << n << " tokens) layer " << layer;
    if (config_.num_groups() > 1) os << " (group " << layer_groups_[size_t(layer)].group << ")";
    if (begin > 0) os << " from position " << begin;
    os << " differs from the model at positions " << ranges(wrong) << " (blocks "
       << ranges(blocks_of(wrong)) << "); first: " << first;
    problem(os.str());
    return false;
  }

  // Builds a batch (CSR too; build_batches with several groups) and checks that each group's
  // device arrays equal its host copy.
  void check_batch(const std::vector<SequenceId>& ids, const std::string& what) {
    std::vector<DeviceBatch> batches;
    BatchOptions options;
    options.build_csr = true;
    const bool several = config_.num_groups() > 1;
    if (!step(what + (several ? ": build_batches" : ": build_batch"), [&] {
          if (several) {
            auto b = cache_->build_batches(ids, options);
            if (b.ok()) batches = *b;
            return b.status();
          }
          auto b = cache_->build_batch(ids, options);
          if (b.ok()) batches = {*b};
          return b.status();
        })) {
      return;
    }
    if (!step(what + ": synchronize after build_batch", [&] { return cache_->synchronize(); })) {
      return;
    }
    if (static_cast<int32_t>(batches.size()) != config_.num_groups()) {
      problem(what + ": build_batches gave " + std::to_string(batches.size()) + " batches");
      return;
    }
    for (size_t g = 0; g < batches.size(); ++g) {
      const DeviceBatch& batch = batches[g];
      const BatchMetadata& m = *batch.host;
      const std::string group = several ? " of group " + std::to_string(g) : "";
      if (batch.group != static_cast<int32_t>(g)) problem(what + ": batch" + group + " mislabeled");
      auto same = [&](const char* field, const auto* device, const auto& host) {
        using T = typename std::decay_t<decltype(host)>::value_type;
        std::vector<T> got(host.size());
        if (!host.empty()) {
          EXPECT_OK(inner_->copy_async(got.data(), device, host.size() * sizeof(T),
                                       CopyKind::kDeviceToHost, Stream{}));
          EXPECT_OK(inner_->synchronize_stream(Stream{}));
        }
        if (got != host) problem(what + ": build_batch uploaded a wrong " + field + group);
      };
      same("slot_mapping", batch.slot_mapping, m.slot_mapping);
      same("block_tables", batch.block_tables, m.block_tables);
      same("seq_lens", batch.seq_lens, m.seq_lens);
      same("indptr", batch.indptr, m.indptr);
      same("indices", batch.indices, m.indices);
      same("last_page_len", batch.last_page_len, m.last_page_len);
    }
  }

  // ---- one cache call ----

  // Runs cache call `f` as step `what`. An injected fault must come back from it as kInternal
  // "injected fault"; the call is then retried once (the fault is one-shot) and must succeed:
  // a failed call changes nothing. Any error without a fault is a problem. Invariants are
  // checked after every attempt. True when the call (or its retry) succeeded.
  bool step(const std::string& what, const std::function<Status()>& f) {
    if (stopped_) return false;
    const int64_t injected = fi_->injected();
    const ControlSnapshot before =
        cache_ != nullptr ? snapshot(*cache_, kMaxId) : ControlSnapshot{};
    Status s = f();
    drain_evicted(what);
    if (!invariants(what)) return false;
    if (fi_->injected() != injected) {
      report_.fault = fi_->last_fault();
      report_.fault_step = what;
      if (s.ok()) return true;  // the cache absorbed the fault; the bytes are checked later
      report_.surfaced = true;
      if (s.code() != StatusCode::kInternal ||
          s.message().find("injected fault") == std::string::npos) {
        problem(what + ": the injected fault came back as " + s.to_string());
      }
      if (cache_ != nullptr) {
        const std::string changed = diff(before, snapshot(*cache_, kMaxId),
                                         storage_ ? storage_scenario_may_change : nullptr);
        if (!changed.empty()) problem(what + ": the failed call changed the cache:" + changed);
      }
      s = f();
      drain_evicted(what + " (retry)");
      if (!invariants(what + " (retry)")) return false;
      if (!s.ok()) {
        problem(what + ": the retry after the injected fault failed: " + s.to_string());
        return false;
      }
      return true;
    }
    if (!s.ok()) problem(what + ": failed without a fault: " + s.to_string());
    return s.ok();
  }

  bool invariants(const std::string& what) {
    if (cache_ == nullptr) return true;
    const Status inv = cache_->check_invariants();
    if (inv.ok()) return true;
    problem(what + ": check_invariants: " + inv.to_string());
    stopped_ = true;  // a broken control plane: what follows would only cascade
    return false;
  }

  void drain_evicted(const std::string& what) {
    if (cache_ == nullptr) return;
    for (SequenceId id : cache_->drain_evicted_sequences()) {
      if (model_.erase(id) == 0) problem(what + ": evicted unknown sequence " + std::to_string(id));
    }
  }

  void problem(const std::string& p) {
    report_.problems.push_back(p);
    if (report_.problems.size() >= kMaxProblemsPerRun) stopped_ = true;
  }

  // ---- helpers ----

  ControlStats stats() const { return cache_ != nullptr ? cache_->stats() : ControlStats{}; }

  std::array<int64_t, kNumFaultKinds> counts() const {
    std::array<int64_t, kNumFaultKinds> out{};
    for (int k = 0; k < kNumFaultKinds; ++k) {
      out[static_cast<size_t>(k)] = fi_->count(static_cast<FaultKind>(k));
    }
    return out;
  }

  // Group `g`'s one-group config, and the one of model layer `layer`'s group.
  const CacheConfig& gconf(int32_t g) const { return group_configs_[static_cast<size_t>(g)]; }
  const CacheConfig& lconf(int32_t layer) const {
    return gconf(layer_groups_[static_cast<size_t>(layer)].group);
  }

  // The first position a read of `len` tokens in group `g` covers (0 without a window).
  int64_t window_begin(int32_t g, int64_t len) const {
    const int32_t w = gconf(g).sliding_window;
    return w == 0 ? 0 : std::max<int64_t>(0, len - w);
  }

  // The index of `id`'s first block that group `g` holds a page of (0 when it holds them all
  // or has none).
  int64_t first_held_block(SequenceId id, int32_t g) const {
    if (config_.groups.empty() || cache_ == nullptr) return 0;
    auto blocks = cache_->block_locations(id, g);
    if (!blocks.ok()) return 0;
    int64_t first = 0;
    while (first < static_cast<int64_t>(blocks->size()) &&
           (*blocks)[static_cast<size_t>(first)].block < 0) {
      ++first;
    }
    return first == static_cast<int64_t>(blocks->size()) ? 0 : first;
  }

  std::vector<TokenId> tokens(int n) {
    std::vector<TokenId> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(rng_() % 50));
    return t;
  }

  static std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  static std::string name(SequenceId id) { return std::string(1, static_cast<char>('A' + id - 1)); }

  std::vector<int64_t> blocks_of(const std::vector<int64_t>& positions) const {
    std::vector<int64_t> out;
    for (int64_t p : positions) {
      if (out.empty() || out.back() != p / config_.block_size)
        out.push_back(p / config_.block_size);
    }
    return out;
  }

  static std::string ranges(const std::vector<int64_t>& v) {
    std::string out;
    for (size_t i = 0; i < v.size();) {
      size_t j = i;
      while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
      if (!out.empty()) out += ",";
      out += std::to_string(v[i]);
      if (j > i) out += "-" + std::to_string(v[j]);
      i = j + 1;
    }
    return out;
  }

  static constexpr SequenceId kMaxId = 5;
  static constexpr uint16_t kPoison = 0xffff;  // a NaN: kv_value never produces it

  // The workload's own transfers go through the inner backend (not counted, never failed), on
  // the compute stream, so they are ordered with the cache's kernels.
  void upload(DeviceBuffer& dst, const std::vector<uint16_t>& src) {
    EXPECT_OK(
        inner_->copy_async(dst.data(), src.data(), src.size() * 2, CopyKind::kHostToDevice, {}));
    EXPECT_OK(inner_->synchronize_stream({}));
  }

  std::vector<uint16_t> download(DeviceBuffer& src, size_t elems) {
    std::vector<uint16_t> out(elems);
    EXPECT_OK(inner_->copy_async(out.data(), src.data(), elems * 2, CopyKind::kDeviceToHost, {}));
    EXPECT_OK(inner_->synchronize_stream({}));
    return out;
  }

  void poison(DeviceBuffer& buf) { upload(buf, std::vector<uint16_t>(buf.bytes() / 2, kPoison)); }

  BackendKind backend_kind_;
  FaultKind kind_;
  int64_t n_;
  int64_t kernel_block_bytes_;
  bool storage_;
  std::vector<std::string> store_dirs_;
  std::vector<std::unique_ptr<StorageTier>> stores_;  // outlive cache_ (reset after it in run())
  std::mt19937_64 rng_;
  CacheConfig config_;
  std::vector<CacheConfig> group_configs_;  // CacheConfig::group_config of each group
  std::vector<LayerGroup> layer_groups_;    // by model layer
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<FaultInjectionBackend> fi_;
  std::unique_ptr<DeviceBuffer> in_k_, in_v_, out_k_, out_v_;
  std::unique_ptr<KvCache> cache_;
  std::map<SequenceId, std::vector<TokenId>> model_;
  RunReport report_;
  bool stopped_ = false;
};

}  // namespace pagedkv::testing
