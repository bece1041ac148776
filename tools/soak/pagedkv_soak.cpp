// pagedkv_soak: runs the randomized KvCache workload (kv_workload.hpp) for many ops and prints
// one summary line, `ops=N mismatches=M invariant_failures=I errors=E ...` (the workload's
// counters, then every count of the cache's ControlStats), then
// `first_problem: ...` when there was one. Exit status 0 only when M, I and E are all 0.
// docs/soak.md describes the workload, the flags and the figures.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <memory>
#include <random>
#include <string>

#include "kv_workload.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/fault_injection.hpp"
#include "pagedkv/stats_fields.hpp"

namespace {

struct Flags {
  int64_t ops = 100000;
  uint64_t seed = 1;
  int64_t copy_delay_us = 0;
  int64_t progress_every = 0;
  std::string backend = "cpu";
  int32_t verify_percent = 8;
  int64_t fault_every = 0;
  bool keep_going = false;
  bool cpu_worker_only = false;
  int64_t transfer_kernel_block_bytes = pagedkv::kDefaultTransferKernelBlockBytes;
};

void print_counters(std::FILE* out, const pagedkv::soak::WorkloadCounters& c) {
  std::fprintf(out,
               "ops=%lld mismatches=%lld invariant_failures=%lld errors=%lld injected_faults=%lld "
               "verified_sequences=%lld verified_bytes=%lld unverifiable=%lld exhausted=%lld "
               "evicted=%lld",
               static_cast<long long>(c.ops), static_cast<long long>(c.mismatches),
               static_cast<long long>(c.invariant_failures), static_cast<long long>(c.errors),
               static_cast<long long>(c.injected_faults),
               static_cast<long long>(c.verified_sequences),
               static_cast<long long>(c.verified_bytes), static_cast<long long>(c.unverifiable),
               static_cast<long long>(c.exhausted), static_cast<long long>(c.evicted));
}

int run(const Flags& f) {
  using pagedkv::soak::KvWorkload;
  pagedkv::soak::WorkloadOptions options;
  options.seed = f.seed;
  options.copy_delay = std::chrono::microseconds(f.copy_delay_us);
  options.verify_percent = f.verify_percent;
  options.stop_at_first_problem = !f.keep_going;
  options.transfer_kernel_block_bytes = f.transfer_kernel_block_bytes;
  std::unique_ptr<pagedkv::Backend> backend;
  if (f.backend == "auto") {
    auto created = pagedkv::create_backend(pagedkv::BackendKind::kAuto);
    if (!created.ok()) {
      std::fprintf(stderr, "pagedkv_soak: %s\n", created.status().to_string().c_str());
      return 2;
    }
    backend = std::move(created).value();
    options.config.backend = pagedkv::BackendKind::kAuto;
  } else if (f.fault_every > 0 || f.cpu_worker_only) {
    pagedkv::CpuBackendOptions cpu;
    cpu.copy_delay = options.copy_delay;
    cpu.run_inline_when_idle = !f.cpu_worker_only;
    backend = pagedkv::create_cpu_backend(cpu);
  }
  // With --fault-every the cache runs on a FaultInjectionBackend; the workload's own uploads and
  // downloads use the backend it wraps.
  std::unique_ptr<pagedkv::FaultInjectionBackend> faults;
  if (f.fault_every > 0) {
    faults = std::make_unique<pagedkv::FaultInjectionBackend>(*backend);
    options.backend = faults.get();
    options.io_backend = backend.get();
    options.tolerate_injected_faults = true;
  } else {
    options.backend = backend.get();  // null: the workload's own CPU backend
  }
  auto created = KvWorkload::create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "pagedkv_soak: %s\n", created.status().to_string().c_str());
    return 2;
  }
  KvWorkload& w = **created;
  std::fprintf(stderr, "pagedkv_soak: %s, seed %llu, %lld ops, copy delay %lld us%s\n",
               w.cache().backend().description().c_str(), static_cast<unsigned long long>(f.seed),
               static_cast<long long>(f.ops), static_cast<long long>(f.copy_delay_us),
               faults != nullptr ? ", injected faults" : "");

  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Runs in chunks: every fault_every ops one kind of call (copy, launch, event, sync, query) is
  // armed to fail within its next 30 calls (one armed at a time: the cache takes a fault back with
  // calls of its own), every progress_every ops the counters are printed.
  const pagedkv::FaultKind kinds[] = {pagedkv::FaultKind::kCopy, pagedkv::FaultKind::kLaunch,
                                      pagedkv::FaultKind::kEvent, pagedkv::FaultKind::kSync,
                                      pagedkv::FaultKind::kQuery};
  std::mt19937_64 rng(f.seed);
  const int64_t progress = f.progress_every > 0 ? f.progress_every : f.ops;
  const int64_t fault = f.fault_every > 0 ? f.fault_every : f.ops;
  for (int64_t done = 0; done < f.ops;) {
    if (faults != nullptr && done % fault == 0) {
      faults->disarm_all();
      faults->fail_nth(kinds[rng() % std::size(kinds)], 1 + static_cast<int64_t>(rng() % 30));
    }
    const int64_t n = std::min({f.ops - done, progress - done % progress, fault - done % fault});
    w.run(n);
    done += n;
    if (!f.keep_going && w.has_problem()) break;
    if (f.progress_every > 0 && done % progress == 0) {
      std::fprintf(stderr, "progress: ");
      print_counters(stderr, w.counters());
      std::fprintf(stderr, " seconds=%.1f\n", seconds());
    }
  }
  if (faults != nullptr) faults->disarm_all();
  if (f.keep_going || !w.has_problem()) w.verify_all();
  const double s = seconds();

  const pagedkv::soak::WorkloadCounters& c = w.counters();
  const pagedkv::ControlStats stats = w.cache().stats();
  print_counters(stdout, c);
  // Every count of the cache's stats (for_each_stat: "device.free_blocks=..", "blocks_demoted=..").
  pagedkv::for_each_stat(stats, [](const std::string& name, int64_t value) {
    std::printf(" %s=%lld", name.c_str(), static_cast<long long>(value));
  });
  if (faults != nullptr) {
    std::printf(" backend_faults=%lld", static_cast<long long>(faults->injected()));
  }
  std::printf(" seconds=%.2f ops_per_s=%.0f\n", s, s > 0 ? c.ops / s : 0.0);
  if (!c.first_problem.empty()) std::printf("first_problem: %s\n", c.first_problem.c_str());
  std::fflush(stdout);
  return c.mismatches == 0 && c.invariant_failures == 0 && c.errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pagedkv_soak: a long randomized KvCache workload checked byte for byte"};
  Flags f;
  app.add_option("--ops", f.ops, "workload ops to run")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", f.seed, "random seed (same seed, same ops)")->capture_default_str();
  app.add_option("--copy-delay-us", f.copy_delay_us,
                 "CPU backend: delay of each copy on the transfer stream, in microseconds")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--transfer-kernel-block-bytes", f.transfer_kernel_block_bytes,
                 "offloads and restores of smaller blocks use the copy kernel (0: batched copies)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--progress-every", f.progress_every,
                 "print the counters to stderr every K ops (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", f.backend,
                 "cpu (the workload's own CPU backend) or auto (CUDA when a device is present)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "auto"}));
  app.add_option("--verify-percent", f.verify_percent, "share of ops that verify a sequence")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_option("--fault-every", f.fault_every,
                 "inject a backend fault (copy, launch, event or sync) into the cache every K ops "
                 "and tolerate it (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--keep-going", f.keep_going,
               "do not stop at the first problem (later counts may follow from it)");
  app.add_flag("--cpu-worker-only", f.cpu_worker_only,
               "CPU backend: hand every copy and launch to the stream's worker thread, also when "
               "the stream is idle (the behaviour before inline execution, for comparison)");
  CLI11_PARSE(app, argc, argv);
  return run(f);
}
