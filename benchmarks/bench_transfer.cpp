// Offload (device -> pinned host) and restore (host -> device) throughput of the transfer
// engine, against a plain copy of the same bytes measured in the same run: memcpy between two
// host buffers on the CPU backend, one contiguous pinned cudaMemcpyAsync on the GPU.
//
// Arguments: tokens per block (16, 64), blocks per job (1 .. 4096), and whether the job's blocks
// are consecutive (merged into one region) or scattered (every other block: one region per
// block; the engine queues all regions of a direction as one Backend::copy_batch).
//
// BM_ScatteredOffload / BM_ScatteredRestore take the engine out: the same scattered blocks moved
// by one copy_async per block (path:0, what the engine did before copy_batch), by one copy_batch
// (path:1, the engine's path for large blocks) or by one launch of the block-copy kernel between
// the device pool and the mapped pinned host pool (path:2, the engine's path for blocks below
// KvCacheOptions::transfer_kernel_block_bytes), each against the same contiguous ceiling. Block
// sizes run from 8 KiB (4 tokens) to 512 KiB (256 tokens): where path:2's ratio falls below
// path:1's is the threshold to set (docs/runtime.md, Transfer engine).
//
// BM_Overlap: a KvCache prefetch beside a spinning compute kernel (KernelId::kSpin, the stand-in
// for a model's forward, over a full wave of every SM), timed synchronize to synchronize
// (gpu-review-3 N2-1, N2-2). Per iteration, on one cache with an offloaded sequence of MiB:
// spin (two spins of spin_us on the compute stream), copy (the prefetch alone), serial (the two
// spins, synchronize, the prefetch, synchronize) and overlapped (a spin, the prefetch submitted
// right after it, the second spin, synchronize). The row's time is the overlapped one; vs_serial
// = overlapped / serial (the ceiling of no overlap, measured in the same run; max/sum where the
// prefetch overlaps compute fully) and vs_ideal = overlapped / max(spin, copy). path:0 moves
// 128 KiB blocks by batched copies (the copy engines), path:1 32 KiB blocks by the copy kernel
// over the mapped host pool, which stretches the spin if it holds the SMs it needs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "ops/ops_common.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "runtime/transfer_engine.hpp"

namespace pagedkv {
namespace {

// A small model shape so that 4096-block jobs fit a CPU machine: 2 layers x 4 KV heads x 64
// dims, fp16: 32 KiB per 16-token block, 128 KiB per 64-token block.
constexpr int64_t kLayers = 2, kHeads = 4, kHeadDim = 64, kElemBytes = 2;

int64_t block_bytes(int64_t tokens) {
  return tokens * kLayers * 2 * kHeads * kHeadDim * kElemBytes;
}

struct Setup {
  std::unique_ptr<Backend> backend;
  void* device = nullptr;
  void* host = nullptr;
  void* scratch = nullptr;  // the ceiling copy's other end
  std::unique_ptr<runtime::TransferEngine> engine;
  void* pairs = nullptr;  // pinned, mapped: the copy kernel's (src, dst) block pairs
  ~Setup() {
    engine.reset();
    if (backend) {
      if (pairs != nullptr) backend->free_pinned(pairs);
      backend->free_device(device);
      backend->free_pinned(host);
      if (backend->kind() == BackendKind::kCuda)
        backend->free_device(scratch);
      else
        backend->free_pinned(scratch);
    }
  }
};

double seconds_of(const std::function<void()>& fn, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

void BM_Transfer(benchmark::State& state, BackendKind kind, bool restore) {
  const int64_t tokens = state.range(0), blocks = state.range(1);
  const bool scattered = state.range(2) != 0;
  auto created = create_backend(kind);
  if (!created.ok()) {
    state.SkipWithError(created.status().to_string().c_str());
    return;
  }
  Setup s;
  s.backend = std::move(created).value();
  const int64_t bb = block_bytes(tokens);
  const int64_t pool_blocks = scattered ? 2 * blocks : blocks;
  const size_t job_bytes = static_cast<size_t>(blocks * bb);
  s.device = *s.backend->allocate_device(static_cast<size_t>(pool_blocks * bb));
  s.host = *s.backend->allocate_pinned(static_cast<size_t>(pool_blocks * bb));
  const bool cuda = s.backend->kind() == BackendKind::kCuda;
  s.scratch =
      cuda ? *s.backend->allocate_device(job_bytes) : *s.backend->allocate_pinned(job_bytes);
  std::memset(s.host, 1, static_cast<size_t>(pool_blocks * bb));
  runtime::TierPools pools{s.device, pool_blocks, s.host, pool_blocks, bb};
  // Batched copies, as for large blocks (BM_Scattered's path:2 rows time the copy kernel).
  s.engine = std::move(runtime::TransferEngine::create(*s.backend, pools)).value();

  std::vector<BlockMove> moves;
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t b = static_cast<int32_t>(scattered ? 2 * i : i);
    moves.push_back(restore ? BlockMove{Tier::kHost, b, Tier::kDevice, b}
                            : BlockMove{Tier::kDevice, b, Tier::kHost, b});
  }
  auto run_job = [&] {
    auto t = s.engine->submit(moves, Stream{});
    if (!t.ok() || !s.engine->wait(*t).ok()) state.SkipWithError("transfer failed");
  };
  // The ceiling: one contiguous copy of the same bytes in the same direction.
  const CopyKind ceiling_kind =
      cuda ? (restore ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost) : CopyKind::kHostToHost;
  void* ceiling_dst = restore ? s.scratch : s.host;
  const void* ceiling_src = restore ? s.host : s.scratch;
  auto run_ceiling = [&] {
    if (!s.backend->copy_async(ceiling_dst, ceiling_src, job_bytes, ceiling_kind, Stream{}).ok() ||
        !s.backend->synchronize_stream(Stream{}).ok())
      state.SkipWithError("ceiling copy failed");
  };
  run_job();
  run_ceiling();
  const int reps = job_bytes >= (64u << 20) ? 2 : 20;
  const double ceiling_s = seconds_of(run_ceiling, reps);

  for (auto _ : state) run_job();

  const double bytes = static_cast<double>(job_bytes) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["job_MiB"] = static_cast<double>(job_bytes) / (1 << 20);
  state.counters["copies_per_job"] =
      static_cast<double>(s.engine->copies_issued()) / static_cast<double>(state.iterations() + 1);
  state.counters["ceiling_GBps"] = static_cast<double>(job_bytes) / ceiling_s / 1e9;
  state.counters["ceiling_s"] = ceiling_s;
}

// How BM_Scattered moves the blocks.
enum ScatteredPath : int64_t { kPerBlock = 0, kBatched = 1, kKernel = 2 };

// Scattered blocks (every other one) moved straight through the backend on a created stream:
// one copy_async per block, one copy_batch of all of them, or one copy kernel launch.
void BM_Scattered(benchmark::State& state, BackendKind kind, bool restore) {
  const int64_t tokens = state.range(0), blocks = state.range(1);
  const auto path = static_cast<ScatteredPath>(state.range(2));
  auto created = create_backend(kind);
  if (!created.ok()) {
    state.SkipWithError(created.status().to_string().c_str());
    return;
  }
  Setup s;
  s.backend = std::move(created).value();
  Backend& b = *s.backend;
  const int64_t bb = block_bytes(tokens);
  const size_t job_bytes = static_cast<size_t>(blocks * bb);
  const size_t pool_bytes = 2 * job_bytes;
  s.device = *b.allocate_device(pool_bytes);
  s.host = *b.allocate_pinned(pool_bytes);
  const bool cuda = b.kind() == BackendKind::kCuda;
  s.scratch = cuda ? *b.allocate_device(job_bytes) : *b.allocate_pinned(job_bytes);
  std::memset(s.host, 1, pool_bytes);
  auto stream = b.create_stream();
  if (!stream.ok()) {
    state.SkipWithError(stream.status().to_string().c_str());
    return;
  }
  std::vector<CopyRegion> regions;
  for (int64_t i = 0; i < blocks; ++i) {
    char* d = static_cast<char*>(s.device) + 2 * i * bb;
    char* h = static_cast<char*>(s.host) + 2 * i * bb;
    regions.push_back(restore ? CopyRegion{d, h, static_cast<size_t>(bb)}
                              : CopyRegion{h, d, static_cast<size_t>(bb)});
  }
  const CopyKind copy_kind = restore ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost;
  // The kernel's pairs (block 2i of one pool to block 2i of the other) in mapped pinned memory,
  // where the transfer engine keeps them.
  ops_detail::BlockCopyPools kernel_pools;
  const void* device_pairs = nullptr;
  if (path == kKernel) {
    auto mapped_host = b.mapped_device_pointer(s.host);
    auto pairs = b.allocate_pinned(static_cast<size_t>(blocks) * 2 * sizeof(int32_t));
    if (!mapped_host.ok() || !pairs.ok()) {
      state.SkipWithError("no mapped pinned memory on this backend");
      return;
    }
    s.pairs = *pairs;
    auto mapped_pairs = b.mapped_device_pointer(s.pairs);
    if (!mapped_pairs.ok()) {
      state.SkipWithError(mapped_pairs.status().to_string().c_str());
      return;
    }
    device_pairs = *mapped_pairs;
    auto* p = static_cast<int32_t*>(s.pairs);
    for (int64_t i = 0; i < blocks; ++i) p[2 * i] = p[2 * i + 1] = static_cast<int32_t>(2 * i);
    char* device = static_cast<char*>(s.device);
    char* host = static_cast<char*>(*mapped_host);
    kernel_pools.dst = restore ? device : host;
    kernel_pools.src = restore ? host : device;
    kernel_pools.dst_blocks = kernel_pools.src_blocks = 2 * blocks;
    kernel_pools.block_bytes = bb;
  }
  auto run_job = [&] {
    Status st = ok_status();
    if (path == kKernel) {
      st = ops_detail::launch_copy_blocks(b, kernel_pools, device_pairs, IndexType::kInt32, blocks,
                                          *stream);
    } else if (path == kBatched) {
      st = b.copy_batch(regions.data(), regions.size(), copy_kind, *stream);
    } else {
      for (const CopyRegion& r : regions) {
        if (st.ok()) st = b.copy_async(r.dst, r.src, r.bytes, copy_kind, *stream);
      }
    }
    if (!st.ok() || !b.synchronize_stream(*stream).ok()) state.SkipWithError("copies failed");
  };
  const CopyKind ceiling_kind = cuda ? copy_kind : CopyKind::kHostToHost;
  void* ceiling_dst = restore ? s.scratch : s.host;
  const void* ceiling_src = restore ? s.host : s.scratch;
  auto run_ceiling = [&] {
    if (!b.copy_async(ceiling_dst, ceiling_src, job_bytes, ceiling_kind, Stream{}).ok() ||
        !b.synchronize_stream(Stream{}).ok())
      state.SkipWithError("ceiling copy failed");
  };
  run_job();
  run_ceiling();
  const int reps = job_bytes >= (64u << 20) ? 2 : 20;
  const double ceiling_s = seconds_of(run_ceiling, reps);

  for (auto _ : state) run_job();

  state.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(job_bytes) *
                                               static_cast<double>(state.iterations())));
  state.counters["job_MiB"] = static_cast<double>(job_bytes) / (1 << 20);
  state.counters["copies_per_job"] = path == kPerBlock ? static_cast<double>(blocks) : 1.0;
  state.counters["block_KiB"] = static_cast<double>(bb) / 1024;
  state.counters["ceiling_GBps"] = static_cast<double>(job_bytes) / ceiling_s / 1e9;
  state.counters["ceiling_s"] = ceiling_s;
  b.destroy_stream(*stream);
}

void scattered_args(benchmark::internal::Benchmark* b) {
  for (int64_t tokens : {4, 16, 64, 256})
    for (int64_t blocks : {16, 256, 4096}) {
      if (blocks * block_bytes(tokens) > (int64_t{512} << 20)) continue;  // pools of 2x the job
      for (int64_t path : {kPerBlock, kBatched, kKernel}) b->Args({tokens, blocks, path});
    }
  b->ArgNames({"tokens", "blocks", "path"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

void args(benchmark::internal::Benchmark* b) {
  for (int64_t tokens : {16, 64})
    for (int64_t blocks : {1, 16, 256, 4096})
      for (int64_t scattered : {0, 1}) b->Args({tokens, blocks, scattered});
  b->ArgNames({"tokens", "blocks", "scattered"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

// How BM_Overlap's prefetch moves its blocks.
enum OverlapPath : int64_t { kOverlapBatched = 0, kOverlapKernel = 1 };

// Indices of a spin that fills every SM for one wave: the threads the device keeps resident
// (Backend::max_resident_threads(), SMs x threads per SM); 1 on the CPU backend, where index 0
// alone spins.
int64_t spin_indices(const Backend& backend) {
  if (backend.kind() != BackendKind::kCuda) return 1;
  return std::max<int64_t>(1, backend.max_resident_threads());
}

void BM_Overlap(benchmark::State& state, BackendKind kind) {
  const auto path = static_cast<OverlapPath>(state.range(0));
  const int64_t mib = state.range(1), spin_ns = state.range(2) * 1000;
  auto created = create_backend(kind);
  if (!created.ok()) {
    state.SkipWithError(created.status().to_string().c_str());
    return;
  }
  std::unique_ptr<Backend> backend = std::move(created).value();
  CacheConfig config;
  config.num_layers = 4;
  config.num_kv_heads = 8;
  config.head_dim = 64;
  config.block_size = path == kOverlapKernel ? 4 : 16;  // 32 KiB or 128 KiB blocks
  const int64_t block_bytes =
      config.block_size * config.num_layers * 2 * config.num_kv_heads * config.head_dim * 2;
  const int64_t blocks = (mib << 20) / block_bytes;
  config.num_device_blocks = blocks + 8;
  config.num_host_blocks = blocks + 8;
  config.backend = backend->kind();
  KvCacheOptions o;
  o.backend = backend.get();
  // Every block through the copy kernel, or none.
  o.transfer_kernel_block_bytes = path == kOverlapKernel ? int64_t{1} << 40 : 0;
  auto cache_or = KvCache::create(config, o);
  if (!cache_or.ok()) {
    state.SkipWithError(cache_or.status().to_string().c_str());
    return;
  }
  std::unique_ptr<KvCache> cache = std::move(cache_or).value();
  std::vector<TokenId> tokens(static_cast<size_t>(blocks * config.block_size));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i % 30000);
  const SequenceId id = 1;
  if (!cache->add_sequence(id, tokens).ok() ||
      !cache->reserve(id, static_cast<int64_t>(tokens.size())).ok() ||
      !cache->commit(id, tokens).ok()) {
    state.SkipWithError("could not set up the sequence");
    return;
  }
  const kernels::SpinBody spin_body{spin_ns};
  const KernelLaunch spin_launch{KernelId::kSpin, &spin_body, sizeof(spin_body),
                                 spin_indices(*backend)};
  bool failed = false;
  auto check = [&](const Status& st) {
    if (!st.ok() && !failed) {
      failed = true;
      state.SkipWithError(st.to_string().c_str());
    }
  };
  auto spin = [&] { check(backend->launch(spin_launch, cache->compute_stream())); };
  auto prefetch = [&] { check(cache->prefetch({id})); };
  auto sync = [&] { check(cache->synchronize()); };
  // Untimed: the sequence back on the host before each timed prefetch.
  auto offload = [&] {
    check(cache->offload(id));
    sync();
    if (!failed && *cache->residency(id) != SequenceResidency::kHost)
      check(internal_error("not offloaded"));
  };
  auto timed = [&](const std::function<void()>& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  spin();  // warm-up: the first launch and transfer
  sync();
  offload();
  prefetch();
  sync();

  double spin_s = 0, copy_s = 0, serial_s = 0, overlapped_s = 0;
  for (auto _ : state) {
    spin_s += timed([&] {
      spin();
      spin();
      sync();
    });
    offload();
    copy_s += timed([&] {
      prefetch();
      sync();
    });
    offload();
    serial_s += timed([&] {
      spin();
      spin();
      sync();
      prefetch();
      sync();
    });
    offload();
    const double o_s = timed([&] {
      spin();
      prefetch();  // right behind the first spin: the copies run beside it
      spin();
      sync();
    });
    if (!failed && *cache->residency(id) != SequenceResidency::kDevice)
      check(internal_error("not restored"));
    overlapped_s += o_s;
    state.SetIterationTime(o_s);
    if (failed) break;
  }
  const double n = static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.counters["seq_MiB"] = static_cast<double>(blocks * block_bytes) / (1 << 20);
  state.counters["block_KiB"] = static_cast<double>(block_bytes) / 1024;
  state.counters["spin_indices"] = static_cast<double>(spin_launch.num_items);
  state.counters["spin_ms"] = spin_s / n * 1e3;
  state.counters["copy_ms"] = copy_s / n * 1e3;
  state.counters["serial_ms"] = serial_s / n * 1e3;
  state.counters["overlapped_ms"] = overlapped_s / n * 1e3;
  if (serial_s > 0) state.counters["vs_serial"] = overlapped_s / serial_s;
  const double ideal = std::max(spin_s, copy_s);
  if (ideal > 0) state.counters["vs_ideal"] = overlapped_s / ideal;
}

void overlap_args(benchmark::internal::Benchmark* b, int64_t mib) {
  for (int64_t path : {kOverlapBatched, kOverlapKernel}) b->Args({path, mib, 5000});
  // A fixed count: each run allocates pools of the sequence's size, and the per-iteration
  // offloads (untimed) double its wall time.
  b->ArgNames({"path", "MiB", "spin_us"})
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
}

// GBps and ratio (ceiling time / job time) are computed by the reporter, from the measured time.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> copy = runs;
    for (Run& r : copy) {
      auto ceiling = r.counters.find("ceiling_s");
      if (ceiling != r.counters.end() && r.iterations > 0 && r.real_accumulated_time > 0) {
        const double per_iter = r.real_accumulated_time / static_cast<double>(r.iterations);
        r.counters["ratio"] = ceiling->second.value / per_iter;
        r.counters["GBps"] = r.counters["job_MiB"].value * (1 << 20) / per_iter / 1e9;
        r.counters.erase("ceiling_s");
      }
    }
    ConsoleReporter::ReportRuns(copy);
  }
};

}  // namespace
}  // namespace pagedkv

int main(int argc, char** argv) {
  using pagedkv::BackendKind;
  benchmark::RegisterBenchmark("BM_Offload/cpu", pagedkv::BM_Transfer, BackendKind::kCpu, false)
      ->Apply(pagedkv::args);
  benchmark::RegisterBenchmark("BM_Restore/cpu", pagedkv::BM_Transfer, BackendKind::kCpu, true)
      ->Apply(pagedkv::args);
  benchmark::RegisterBenchmark("BM_ScatteredOffload/cpu", pagedkv::BM_Scattered, BackendKind::kCpu,
                               false)
      ->Apply(pagedkv::scattered_args);
  benchmark::RegisterBenchmark("BM_ScatteredRestore/cpu", pagedkv::BM_Scattered, BackendKind::kCpu,
                               true)
      ->Apply(pagedkv::scattered_args);
  // The CPU rows move 32 MiB (memcpy on the stream workers, about as long as the spins);
  // the GPU rows 256 MiB, about 5 ms over PCIe at 50 GB/s (gpu-review-3 N2-1).
  benchmark::RegisterBenchmark("BM_Overlap/cpu", pagedkv::BM_Overlap, BackendKind::kCpu)
      ->Apply([](benchmark::internal::Benchmark* b) { pagedkv::overlap_args(b, 32); });
  if (pagedkv::cuda_device_available()) {
    benchmark::RegisterBenchmark("BM_Overlap/cuda", pagedkv::BM_Overlap, BackendKind::kCuda)
        ->Apply([](benchmark::internal::Benchmark* b) { pagedkv::overlap_args(b, 256); });
    benchmark::RegisterBenchmark("BM_Offload/cuda", pagedkv::BM_Transfer, BackendKind::kCuda, false)
        ->Apply(pagedkv::args);
    benchmark::RegisterBenchmark("BM_Restore/cuda", pagedkv::BM_Transfer, BackendKind::kCuda, true)
        ->Apply(pagedkv::args);
    benchmark::RegisterBenchmark("BM_ScatteredOffload/cuda", pagedkv::BM_Scattered,
                                 BackendKind::kCuda, false)
        ->Apply(pagedkv::scattered_args);
    benchmark::RegisterBenchmark("BM_ScatteredRestore/cuda", pagedkv::BM_Scattered,
                                 BackendKind::kCuda, true)
        ->Apply(pagedkv::scattered_args);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  pagedkv::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
