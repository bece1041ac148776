// KvCache under backend faults. A fixed scenario (shared prefixes, copy-on-write after fork,
// offload under memory pressure, explicit offload and restore, gather, build_batch, rollback,
// finish and prefix reuse) runs on a backend wrapped by FaultInjectionBackend; it is rerun
// from scratch with the n-th allocation, copy, launch, event or sync call failing, for every n
// the fault-free run reaches. The contract checked each time: the failed cache call returns the
// injected kInternal error and changes nothing, so a retry succeeds; check_invariants() holds
// after every call; at the end every live sequence reads back exactly the bytes of its token
// list (tests/runtime/kv_model.hpp) and the cache still takes, writes and reads one more token
// per sequence. The workload's own uploads and downloads go through the inner backend, so only
// the cache's calls are counted and failed. Every test runs on both backends
// (runtime_backends.hpp); on the CPU backend the copies are delayed so that transfers really lag.
//
// A second, storage scenario runs the same way with a FileTier behind a host tier of 2 blocks: a
// prompt's blocks are demoted and dropped to storage (demotions and drops in the same calls),
// fetched back and hit by a new sequence, whose bytes must be the model's. A failed call there
// may keep what a tier move keeps (host blocks it dropped), and the storage counters move as
// write-backs finish in the background; nothing else may change.
//
// PAGEDKV_FAULT_STRIDE=k sweeps every k-th n past the first 50 of each kind (default 1: all);
// PAGEDKV_FAULT_VERBOSE=1 prints one line per run (where the fault fired, whether it surfaced).
#include "pagedkv/fault_injection.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/storage_tier.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::kv_value;
using testing::model_rows;

constexpr FaultKind kAllKinds[] = {FaultKind::kAllocation, FaultKind::kCopy, FaultKind::kLaunch,
                                   FaultKind::kEvent,      FaultKind::kSync, FaultKind::kQuery};
constexpr size_t kMaxProblemsPerRun = 6;

CacheConfig scenario_config() {
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

// A backend of `kind`; on the CPU its copies lag by 20 us (a device's lag on their own).
std::unique_ptr<Backend> slow_copy_backend(BackendKind kind) {
  CpuBackendOptions options;
  options.copy_delay = std::chrono::microseconds(20);  // transfers really lag behind
  return testing::make_backend(kind, options);
}

std::string describe(const LiveObjects& l) {
  return std::to_string(l.device_allocations) + " device allocations, " +
         std::to_string(l.pinned_allocations) + " pinned allocations, " +
         std::to_string(l.streams) + " streams, " + std::to_string(l.events) + " events";
}

// What one run of the scenario saw.
struct RunReport {
  std::string fault;       // the injected fault's message; "" when it never fired
  std::string fault_step;  // the scenario step whose cache call it fired in
  bool surfaced = false;   // that cache call returned it
  std::vector<std::string> problems;
  std::array<int64_t, kNumFaultKinds> counts{};
  ControlStats stats;
  int64_t pressure_offloads = 0;  // sequences offloaded by reserve (not by offload())
  int64_t prefix_hit_tokens = 0;  // tokens add_sequence found cached
  int64_t verified = 0;           // sequences whose every layer matched the model
};

// The control plane's view of the cache, read without any backend call (so taking it does not
// change the counts): what a failed call must leave as it was.
struct ControlSnapshot {
  testing::NamedStats stats;
  std::map<SequenceId, std::string> sequences;  // length, pending and block locations
};

ControlSnapshot snapshot(const KvCache& cache, SequenceId max_id) {
  ControlSnapshot out;
  out.stats = testing::named_stats(cache.stats());
  for (SequenceId id = 1; id <= max_id; ++id) {
    if (!cache.contains(id)) continue;
    std::ostringstream os;
    os << "length " << cache.length(id).value_or(-1) << ", pending "
       << cache.pending(id).value_or(-1) << ", blocks [";
    for (const BlockLocation& b : cache.block_locations(id).value_or({})) {
      os << (b.tier == Tier::kDevice ? " d" : " h") << b.block;
    }
    os << " ]";
    out.sequences[id] = os.str();
  }
  return out;
}

// "" when equal, else what changed.
// The counts a failed call of the storage scenario may leave changed: the storage counters
// (write-backs finish in the background and any later call collects them) and what a tier move
// keeps when it is taken back: unreferenced cached blocks it evicted or dropped (with a host
// tier of 2 blocks a reserve demotes and drops them all the time; docs/tiers.md, Failure rules),
// and the tiers' free / cached split. Every sequence must still be exactly as it was.
bool storage_scenario_may_change(const std::string& name) {
  return name.rfind("storage_", 0) == 0 || name == "host_blocks_dropped" ||
         name == "blocks_evicted" || name.rfind("host.", 0) == 0 || name == "device.free_blocks" ||
         name == "device.cached_blocks" || name == "device.used_bytes";
}

std::string diff(const ControlSnapshot& a, const ControlSnapshot& b,
                 bool (*may_change)(const std::string&) = nullptr) {
  std::ostringstream os;
  testing::NamedStats x = a.stats, y = b.stats;
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
  os << testing::stats_diff(x, y);
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
  // `kernel_block_bytes`: KvCacheOptions::transfer_kernel_block_bytes (the default sends the
  // scenario's small blocks through the copy kernel, 0 through batched copies).
  // `storage`: the storage scenario (a FileTier behind a host tier of 2 blocks).
  FaultScenario(BackendKind backend, FaultKind kind, int64_t n,
                int64_t kernel_block_bytes = kDefaultTransferKernelBlockBytes, bool storage = false)
      : backend_kind_(backend),
        kind_(kind),
        n_(n),
        kernel_block_bytes_(kernel_block_bytes),
        storage_(storage),
        rng_(20240611) {
    if (storage_) {
      config_.num_device_blocks = 8;
      config_.num_host_blocks = 2;
    }
  }

  RunReport run() {
    inner_ = slow_copy_backend(backend_kind_);
    if (inner_ == nullptr) {
      report_.problems.push_back("no backend of the test's kind");
      return report_;
    }
    fi_ = std::make_unique<FaultInjectionBackend>(*inner_);
    if (n_ > 0) fi_->fail_nth(kind_, n_);
    const int64_t row_bytes = config_.num_kv_heads * config_.head_dim * 2;
    const size_t bytes =
        static_cast<size_t>(config_.num_layers * config_.max_sequence_length * row_bytes);
    in_k_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    in_v_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    out_k_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    out_v_ = std::make_unique<DeviceBuffer>(*inner_, bytes);
    if (storage_ && !open_store()) return report_;
    if (storage_) {
      storage_scenario();
    } else {
      scenario();
    }
    for (int k = 0; k < kNumFaultKinds; ++k) {
      report_.counts[static_cast<size_t>(k)] = fi_->count(static_cast<FaultKind>(k));
    }
    if (cache_ != nullptr) report_.stats = cache_->stats();
    const int64_t injected_before_destroy = fi_->injected();
    cache_.reset();
    store_.reset();
    if (!store_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(store_dir_, ec);
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
      const int64_t length = static_cast<int64_t>(model_[kA].size()) - 5;
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

  bool open_store() {
    char tmpl[] = "/tmp/pagedkv-fault-store-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      problem("mkdtemp failed");
      return false;
    }
    store_dir_ = tmpl;
    FileTierOptions fo;
    fo.directory = store_dir_;
    auto store = make_file_tier(StorageLayout::from_config(config_, "fault-model"), fo);
    if (!store.ok()) {
      problem("make_file_tier: " + store.status().to_string());
      return false;
    }
    store_ = std::move(store).value();
    return true;
  }

  bool create() {
    KvCacheOptions options;
    options.backend = fi_.get();
    options.transfer_kernel_block_bytes = kernel_block_bytes_;
    options.storage = store_.get();
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
    const int64_t row = config_.num_kv_heads * config_.head_dim;
    std::vector<uint16_t> k, v;  // [layers][n, heads, dim]
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const std::vector<uint16_t> lk = model_rows(config_, l, 0, t, start);
      const std::vector<uint16_t> lv = model_rows(config_, l, 1, t, start);
      k.insert(k.end(), lk.begin(), lk.end());
      v.insert(v.end(), lv.begin(), lv.end());
    }
    upload(*in_k_, k);
    upload(*in_v_, v);
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const size_t offset = static_cast<size_t>(l * n * row) * 2;
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

  void offload_and_restore(SequenceId id, const std::string& who) {
    if (model_.count(id) == 0) return;
    if (!step("offload " + who, [&] { return cache_->offload(id); })) return;
    step("restore " + who, [&] { return cache_->restore(id); });
  }

  // Restores `id` if it is on the host, gathers every layer and compares it with the model.
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
      poison(*out_k_);
      poison(*out_v_);
      if (!step(what + ": gather_layer " + std::to_string(l), [&] {
            return cache_->gather_layer(id, l, out_k_->data(), out_v_->data(), DType::kFloat16,
                                        PackedLayout::kTokenMajor);
          })) {
        return;
      }
      if (!step(what + ": synchronize", [&] { return cache_->synchronize(); })) return;
      const size_t elems = static_cast<size_t>(n * config_.num_kv_heads * config_.head_dim);
      const std::vector<uint16_t> k = download(*out_k_, elems), v = download(*out_v_, elems);
      all_match = compare(id, l, model, k, v, what) && all_match;
    }
    if (all_match) ++report_.verified;
  }

  // Whether the control plane has every block of `id` on the device (no backend call).
  bool on_device(SequenceId id) const {
    auto blocks = cache_->block_locations(id);
    if (!blocks.ok()) return false;
    for (const BlockLocation& b : *blocks) {
      if (b.tier != Tier::kDevice) return false;
    }
    return true;
  }

  // Compares one gathered layer with the model; one problem naming the wrong positions.
  bool compare(SequenceId id, int32_t layer, const std::vector<TokenId>& model,
               const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
               const std::string& what) {
    const int64_t n = static_cast<int64_t>(model.size());
    std::vector<int64_t> wrong;
    std::string first;
    for (int64_t t = 0; t < n; ++t) {
      bool bad = false;
      for (int32_t h = 0; h < config_.num_kv_heads; ++h)
        for (int32_t d = 0; d < config_.head_dim; ++d) {
          const size_t i =
              static_cast<size_t>((t * config_.num_kv_heads + h) * config_.head_dim + d);
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
    os << what << ": seq " << id << " (" << n << " tokens) layer " << layer << " differs from the "
       << "model at positions " << ranges(wrong) << " (blocks " << ranges(blocks_of(wrong))
       << "); first: " << first;
    problem(os.str());
    return false;
  }

  // Builds a batch (CSR too) and checks that its device arrays equal its host copy.
  void check_batch(const std::vector<SequenceId>& ids, const std::string& what) {
    DeviceBatch batch;
    BatchOptions options;
    options.build_csr = true;
    if (!step(what + ": build_batch", [&] {
          auto b = cache_->build_batch(ids, options);
          if (b.ok()) batch = *b;
          return b.status();
        })) {
      return;
    }
    if (!step(what + ": synchronize after build_batch", [&] { return cache_->synchronize(); })) {
      return;
    }
    const BatchMetadata& m = *batch.host;
    auto same = [&](const char* field, const auto* device, const auto& host) {
      using T = typename std::decay_t<decltype(host)>::value_type;
      std::vector<T> got(host.size());
      if (!host.empty()) {
        EXPECT_OK(inner_->copy_async(got.data(), device, host.size() * sizeof(T),
                                     CopyKind::kDeviceToHost, Stream{}));
        EXPECT_OK(inner_->synchronize_stream(Stream{}));
      }
      if (got != host) problem(what + ": build_batch uploaded a wrong " + field);
    };
    same("slot_mapping", batch.slot_mapping, m.slot_mapping);
    same("block_tables", batch.block_tables, m.block_tables);
    same("seq_lens", batch.seq_lens, m.seq_lens);
    same("indptr", batch.indptr, m.indptr);
    same("indices", batch.indices, m.indices);
    same("last_page_len", batch.last_page_len, m.last_page_len);
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
  std::string store_dir_;
  std::unique_ptr<StorageTier> store_;  // outlives cache_ (reset after it in run())
  std::mt19937_64 rng_;
  CacheConfig config_ = scenario_config();
  std::unique_ptr<Backend> inner_;
  std::unique_ptr<FaultInjectionBackend> fi_;
  std::unique_ptr<DeviceBuffer> in_k_, in_v_, out_k_, out_v_;
  std::unique_ptr<KvCache> cache_;
  std::map<SequenceId, std::vector<TokenId>> model_;
  RunReport report_;
  bool stopped_ = false;
};

int64_t stride_from_env() {
  const char* s = std::getenv("PAGEDKV_FAULT_STRIDE");
  const int64_t stride = s != nullptr ? std::atoll(s) : 1;
  return stride > 0 ? stride : 1;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += "\n    - " + s;
  return out;
}

class KvCacheFaultInjection : public testing::BackendParamTest {};
INSTANTIATE_TEST_SUITE_P(Backends, KvCacheFaultInjection, testing::runtime_backends(),
                         testing::backend_param_name);

TEST_P(KvCacheFaultInjection, TheScenarioWithoutFaultsMatchesTheModel) {
  const RunReport clean = FaultScenario(kind(), FaultKind::kCopy, 0).run();
  EXPECT_TRUE(clean.problems.empty()) << join(clean.problems);
  EXPECT_TRUE(clean.fault.empty());
  // The scenario reaches every path that issues backend work.
  EXPECT_GT(clean.prefix_hit_tokens, 0);
  EXPECT_GT(clean.stats.copy_on_write, 0);
  EXPECT_GT(clean.pressure_offloads, 0);
  EXPECT_GE(clean.stats.sequences_offloaded, clean.pressure_offloads + 2);
  EXPECT_GT(clean.stats.sequences_restored, 0);
  EXPECT_GE(clean.verified, 8);
  for (FaultKind kind : kAllKinds) {
    EXPECT_GT(clean.counts[static_cast<size_t>(kind)], 0) << fault_kind_name(kind);
    RecordProperty(std::string("calls_") + fault_kind_name(kind),
                   std::to_string(clean.counts[static_cast<size_t>(kind)]));
  }
}

// Reruns the scenario with the n-th call of each of `kinds` failing, for every n the fault-free
// run reaches (with the given transfer path).
void sweep(BackendKind backend, const std::vector<FaultKind>& kinds, int64_t kernel_block_bytes,
           bool storage = false) {
  const RunReport clean =
      FaultScenario(backend, FaultKind::kCopy, 0, kernel_block_bytes, storage).run();
  ASSERT_TRUE(clean.problems.empty()) << join(clean.problems);
  const int64_t stride = stride_from_env();
  const bool verbose = std::getenv("PAGEDKV_FAULT_VERBOSE") != nullptr;  // one line per run
  const auto t0 = std::chrono::steady_clock::now();
  std::ostringstream summary;
  for (FaultKind kind : kinds) {
    const int64_t calls = clean.counts[static_cast<size_t>(kind)];
    int64_t runs = 0, fired = 0, surfaced = 0, failing = 0;
    for (int64_t n = 1; n <= calls; n = n < 50 ? n + 1 : n + stride) {
      const RunReport r = FaultScenario(backend, kind, n, kernel_block_bytes, storage).run();
      ++runs;
      fired += r.fault.empty() ? 0 : 1;
      surfaced += r.surfaced ? 1 : 0;
      if (verbose) {
        std::cout << fault_kind_name(kind) << " n=" << n << ": " << r.fault << " in '"
                  << r.fault_step << "'" << (r.surfaced ? "" : " (absorbed)")
                  << (r.problems.empty() ? " ok" : " FAILING") << "\n";
      }
      if (r.problems.empty()) continue;
      ++failing;
      ADD_FAILURE() << fault_kind_name(kind) << " n=" << n << ": "
                    << (r.fault.empty() ? "(the fault never fired)" : r.fault) << " in step '"
                    << r.fault_step << "'" << (r.surfaced ? "" : " (absorbed by the cache)")
                    << join(r.problems);
    }
    summary << fault_kind_name(kind) << ": " << calls << " calls, " << runs << " runs, " << fired
            << " fired, " << surfaced << " surfaced, " << failing << " failing\n";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << summary.str() << "sweep: " << seconds << " s\n";
  ::testing::Test::RecordProperty("sweep_seconds", std::to_string(seconds));
}

// The scenario's blocks are small: offloads and restores go through the copy kernel, so a
// failed transfer is a failed launch (or a failed allocation of its pairs buffer).
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesTheCacheConsistent) {
  sweep(kind(), {std::begin(kAllKinds), std::end(kAllKinds)}, kDefaultTransferKernelBlockBytes);
}

// The same with batched copies (threshold 0): a failed transfer is a failed copy_batch. Only
// the kinds whose calls differ between the paths.
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesTheCacheConsistentWithBatchedCopies) {
  sweep(kind(), {FaultKind::kCopy, FaultKind::kAllocation}, 0);
}

// The storage scenario without faults reaches write-back and a hit read back from storage.
TEST_P(KvCacheFaultInjection, TheStorageScenarioWithoutFaultsMatchesTheModel) {
  const RunReport clean =
      FaultScenario(kind(), FaultKind::kCopy, 0, kDefaultTransferKernelBlockBytes, true).run();
  EXPECT_TRUE(clean.problems.empty()) << join(clean.problems);
  EXPECT_GE(clean.stats.storage_blocks_written, 4);
  EXPECT_EQ(clean.stats.storage_hit_blocks, 2) << "A's first two blocks fill the host tier";
  EXPECT_GE(clean.prefix_hit_tokens, 8);
  EXPECT_GE(clean.verified, 2);
}

// The storage scenario with the n-th call of every kind failing: the staging copies, their
// events, the storage reads' events, every cache call around them.
TEST_P(KvCacheFaultInjection, EveryInjectedFaultLeavesTheCacheConsistentWithAStorageTier) {
  sweep(kind(), {std::begin(kAllKinds), std::end(kAllKinds)}, kDefaultTransferKernelBlockBytes,
        /*storage=*/true);
}

// KvCache::create allocates (pools, upload ring) and creates a stream and events: a fault in any
// of them makes create return it and leaves nothing behind.
TEST_P(KvCacheFaultInjection, CreateFailsCleanlyAtEveryFault) {
  const CacheConfig config = scenario_config();
  std::array<int64_t, kNumFaultKinds> calls{};
  {
    auto inner = slow_copy_backend(this->kind());
    ASSERT_NE(inner, nullptr);
    FaultInjectionBackend fi(*inner);
    KvCacheOptions options;
    options.backend = &fi;
    auto cache = KvCache::create(config, options);
    ASSERT_OK(cache);
    for (FaultKind kind : kAllKinds) {
      calls[static_cast<size_t>(kind)] = fi.count(kind);
    }
    cache = StatusOr<std::unique_ptr<KvCache>>(internal_error("released"));
    EXPECT_EQ(fi.live(), LiveObjects{}) << describe(fi.live());
  }
  EXPECT_GE(calls[static_cast<size_t>(FaultKind::kAllocation)], 2);
  int64_t runs = 0;
  for (FaultKind kind : kAllKinds) {
    for (int64_t n = 1; n <= calls[static_cast<size_t>(kind)]; ++n) {
      ++runs;
      auto inner = slow_copy_backend(this->kind());
      ASSERT_NE(inner, nullptr);
      FaultInjectionBackend fi(*inner);
      fi.fail_nth(kind, n);
      KvCacheOptions options;
      options.backend = &fi;
      auto cache = KvCache::create(config, options);
      const std::string where = std::string(fault_kind_name(kind)) + " #" + std::to_string(n) +
                                " (" + fi.last_fault() + ")";
      ASSERT_EQ(fi.injected(), 1) << where;
      ASSERT_FALSE(cache.ok()) << where << ": create succeeded";
      EXPECT_EQ(cache.status().code(), StatusCode::kInternal) << where;
      EXPECT_NE(cache.status().message().find("injected fault"), std::string::npos)
          << where << ": " << cache.status().to_string();
      EXPECT_EQ(fi.live(), LiveObjects{}) << where << ": left " << describe(fi.live());
      // Nothing is left armed: the next create works and releases everything.
      auto again = KvCache::create(config, options);
      ASSERT_OK(again) << where;
      again = StatusOr<std::unique_ptr<KvCache>>(internal_error("released"));
      EXPECT_EQ(fi.live(), LiveObjects{}) << where << ": left " << describe(fi.live());
    }
  }
  EXPECT_GT(runs, 3);
}

// A failed kernel launch (or slot-mapping upload) inside write_kv returns the error; the same
// write_kv then succeeds and the bytes are right.
TEST_P(KvCacheFaultInjection, WriteKvRecoversFromAFailedLaunchOrUpload) {
  const CacheConfig config = scenario_config();
  for (FaultKind kind : {FaultKind::kLaunch, FaultKind::kCopy}) {
    auto inner = slow_copy_backend(this->kind());
    ASSERT_NE(inner, nullptr);
    FaultInjectionBackend fi(*inner);
    KvCacheOptions options;
    options.backend = &fi;
    auto created = KvCache::create(config, options);
    ASSERT_OK(created);
    std::unique_ptr<KvCache> cache = std::move(created).value();
    const std::vector<TokenId> prompt = {3, 1, 4, 1, 5, 9, 2};
    const int64_t n = static_cast<int64_t>(prompt.size());
    ASSERT_OK(cache->add_sequence(7, prompt));
    ASSERT_OK(cache->reserve(7, n));
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      const std::vector<uint16_t> k = model_rows(config, layer, 0, prompt, 0);
      const std::vector<uint16_t> v = model_rows(config, layer, 1, prompt, 0);
      DeviceBuffer dk(*inner, k.size() * 2), dv(*inner, v.size() * 2);
      dk.upload(k);
      dv.upload(v);
      // The slot mapping is uploaded by the first write_kv of a reservation only.
      if (kind == FaultKind::kCopy && layer > 0) {
        ASSERT_OK(cache->write_kv(7, layer, dk.data(), dv.data(), DType::kFloat16));
        ASSERT_OK(cache->synchronize());
        continue;
      }
      fi.fail_nth(kind, 1);
      const Status failed = cache->write_kv(7, layer, dk.data(), dv.data(), DType::kFloat16);
      EXPECT_EQ(failed.code(), StatusCode::kInternal) << fault_kind_name(kind);
      EXPECT_NE(failed.message().find(std::string("injected fault: ") + fault_kind_name(kind)),
                std::string::npos)
          << failed.to_string();
      EXPECT_OK(cache->check_invariants());
      const Status again = cache->write_kv(7, layer, dk.data(), dv.data(), DType::kFloat16);
      ASSERT_OK(again) << fault_kind_name(kind);
      ASSERT_OK(cache->synchronize());  // the inputs go out of scope
    }
    ASSERT_OK(cache->commit(7, prompt));
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      const size_t elems = static_cast<size_t>(n * config.num_kv_heads * config.head_dim);
      DeviceBuffer k(*inner, elems * 2), v(*inner, elems * 2);
      ASSERT_OK(cache->gather_layer(7, layer, k.data(), v.data(), DType::kFloat16,
                                    PackedLayout::kTokenMajor));
      ASSERT_OK(cache->synchronize());
      EXPECT_EQ(k.download<uint16_t>(), model_rows(config, layer, 0, prompt, 0))
          << fault_kind_name(kind) << " layer " << layer;
      EXPECT_EQ(v.download<uint16_t>(), model_rows(config, layer, 1, prompt, 0))
          << fault_kind_name(kind) << " layer " << layer;
    }
    EXPECT_EQ(fi.injected(), kind == FaultKind::kCopy ? 1 : config.num_layers);
  }
}

}  // namespace
}  // namespace pagedkv
