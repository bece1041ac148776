// Data-plane op throughput at decode and prefill sizes, against a plain copy of the same bytes
// measured in the same run (memcpy on the CPU backend, device-to-device cudaMemcpy on CUDA:
// both through Backend::copy_async). Counters: bytes_per_second (K+V payload), vs_copy (op
// throughput / copy throughput). Model shape: 8 KV heads x 128 dim, fp16, 2 layers, block 16.
//
// Decode rows queue kDecodeBurst calls back to back and synchronise once (a decode step queues
// its layers' writes the same way), so their time is a launch's, not a host round trip's; their
// vs_empty is that time over an empty launch's (a one-word kernel) measured in the same run, the
// floor of any launch, which `launch/empty` reports alone. `decode_step/*` rows write one decode
// step of B = 256 sequences into a 32-layer pool, one write_kv per layer or one
// write_kv_all_layers. After the table, each goal row is printed with its verdict (the goals are
// read on a GPU; docs/gpu-check.md): decode write_kv of one layer within 1.5x an empty launch,
// prefill write_kv, gather_layer and copy_blocks at >= 0.9 of the copy.
//
// Runs on the CPU backend always and on CUDA when a device is present. Default min time is
// short (0.05 s per benchmark); pass --benchmark_min_time to change it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/goal_reporter.hpp"
#include "device_data.hpp"
#include "kernels/basic_bodies.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/ops.hpp"

namespace pagedkv {
namespace {

constexpr int kHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kLayers = 2;
constexpr int kBlockSize = 16;
constexpr DType kDType = DType::kFloat16;
constexpr int64_t kRowBytes = int64_t{kHeads} * kHeadDim * 2;
// Calls queued back to back per synchronisation in the decode rows.
constexpr int kDecodeBurst = 32;
// The decode step rows' model: 32 layers, B = 256.
constexpr int kStepLayers = 32;
constexpr int64_t kStepBatch = 256;
// The goals of the issue, read on a GPU.
constexpr double kGoalDecodeVsEmpty = 1.5;
constexpr double kGoalPrefillVsCopy = 0.9;

enum class Op { kWriteKv, kGather, kImport, kScatter, kCopyBlocks };

const char* op_name(Op op) {
  switch (op) {
    case Op::kWriteKv:
      return "write_kv";
    case Op::kGather:
      return "gather_layer";
    case Op::kImport:
      return "import_layer";
    case Op::kScatter:
      return "scatter_head_range";
    case Op::kCopyBlocks:
      return "copy_blocks";
  }
  return "?";
}

/// Device memory freed with its backend.
struct Buf {
  Backend* be = nullptr;
  void* p = nullptr;
  Buf(Backend& b, size_t n) : be(&b) { p = b.allocate_device(n == 0 ? 1 : n).value(); }
  ~Buf() { be->free_device(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

void upload(Backend& be, void* dst, const void* src, size_t n) {
  (void)be.copy_async(dst, src, n, CopyKind::kHostToDevice, {});
  (void)be.synchronize_stream({});
}

/// Fills `bytes` of backend memory with finite kDType values, made where the memory is (on the
/// device on CUDA: no PCIe copy of a pool-sized buffer in a short GPU slot).
void fill(Backend& be, void* dst, size_t bytes, uint64_t seed) {
  const auto n = static_cast<int64_t>(bytes / dtype_size(kDType));
  (void)testing::fill_pattern(be, {}, dst, n, kDType, seed);
  (void)be.synchronize_stream({});
}

/// Seconds per call of `fn`: `reps` bursts of `burst` calls queued back to back, each burst
/// followed by one stream synchronisation.
double time_per_call(Backend& be, int reps, int burst, const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    for (int i = 0; i < burst; ++i) fn();
    (void)be.synchronize_stream({});
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
         (double(reps) * burst);
}

/// Seconds per launch of an empty kernel (a fill of one 32-bit word at `word`), queued in bursts
/// of kDecodeBurst with one synchronisation each: the floor of any launch on `be`.
double empty_launch_seconds(Backend& be, void* word, int reps) {
  const kernels::FillBody fill{static_cast<uint32_t*>(word), 0x5a5a5a5au};
  const KernelLaunch launch{KernelId::kFill, &fill, sizeof(fill), 1};
  const auto once = [&] { (void)be.launch(launch, {}); };
  (void)time_per_call(be, 1, kDecodeBurst, once);  // warm-up
  return time_per_call(be, reps, kDecodeBurst, once);
}

/// `decode`: `n` sequences (or block pairs) of one token each; else one sequence of n tokens.
void run_op(benchmark::State& state, BackendKind kind, Op op, bool decode) {
  auto be_or = create_backend(kind);
  if (!be_or.ok()) {
    state.SkipWithError(be_or.status().to_string().c_str());
    return;
  }
  Backend& be = **be_or;
  const int64_t n = state.range(0);
  // Decode tokens land one per block in shuffled blocks; prefill tokens fill shuffled blocks.
  const int64_t blocks_used = decode ? n : (n + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = blocks_used * (op == Op::kCopyBlocks ? 2 : 1) + 1;
  PoolLayout layout;
  layout.num_layers = kLayers;
  layout.num_kv_heads = kHeads;
  layout.head_dim = kHeadDim;
  layout.block_size = kBlockSize;
  const size_t pool_bytes = size_t(num_blocks * layout.block_elems() * 2);
  const size_t payload = op == Op::kCopyBlocks ? size_t(blocks_used * layout.block_elems() * 2)
                                               : size_t(2 * n * kRowBytes);

  std::mt19937 rng(1);
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    slots[size_t(t)] = decode
                           ? int64_t{blocks[size_t(t)]} * kBlockSize + 5
                           : int64_t{blocks[size_t(t / kBlockSize)]} * kBlockSize + t % kBlockSize;
  }
  std::vector<int32_t> pairs;
  for (int64_t i = 0; i < blocks_used; ++i) {
    pairs.push_back(blocks[size_t(i)]);
    pairs.push_back(blocks[size_t(blocks_used + i)]);
  }
  std::vector<int32_t> indptr(size_t(n) + 1);
  std::iota(indptr.begin(), indptr.end(), 0);

  Buf pool(be, pool_bytes), k(be, payload / 2), v(be, payload / 2), dslots(be, slots.size() * 8),
      dtable(be, blocks.size() * 4), dpairs(be, pairs.size() * 4 + 8),
      dindptr(be, indptr.size() * 4), copy_dst(be, payload);
  fill(be, pool.p, pool_bytes, 1);
  fill(be, k.p, payload / 2, 2);
  fill(be, v.p, payload / 2, 3);
  upload(be, dslots.p, slots.data(), slots.size() * 8);
  upload(be, dtable.p, blocks.data(), blocks.size() * 4);
  if (!pairs.empty()) upload(be, dpairs.p, pairs.data(), pairs.size() * 4);
  upload(be, dindptr.p, indptr.data(), indptr.size() * 4);

  const PoolRef ref{pool.p, kDType, layout, num_blocks};
  std::function<Status()> call;
  switch (op) {
    case Op::kWriteKv:
      call = [&] {
        WriteKvArgs a;
        a.key = k.p;
        a.value = v.p;
        a.num_tokens = n;
        a.slot_mapping = static_cast<const int64_t*>(dslots.p);
        return write_kv(be, ref, a);
      };
      break;
    case Op::kGather:
    case Op::kImport:
      if (decode) {  // a batch of n one-token sequences, table row s = block s
        call = [&] {
          PackedBatchArgs a;
          a.key = k.p;
          a.value = v.p;
          a.block_tables = static_cast<const int32_t*>(dtable.p);
          a.max_blocks_per_seq = 1;
          a.indptr = static_cast<const int32_t*>(dindptr.p);
          a.batch_size = int32_t(n);
          a.total_tokens = n;
          return op == Op::kGather ? gather_layer_batch(be, ref, a)
                                   : import_layer_batch(be, ref, a);
        };
      } else {
        call = [&] {
          PackedLayerArgs a;
          a.key = k.p;
          a.value = v.p;
          a.block_table = static_cast<const int32_t*>(dtable.p);
          a.block_table_len = int32_t(blocks_used);
          a.num_tokens = n;
          return op == Op::kGather ? gather_layer(be, ref, a) : import_layer(be, ref, a);
        };
      }
      break;
    case Op::kScatter:
      call = [&] {
        ScatterHeadRangeArgs a;
        a.key = k.p;
        a.value = v.p;
        a.block_table = static_cast<const int32_t*>(dtable.p);
        a.block_table_len = int32_t(blocks_used);
        a.num_heads = kHeads;
        a.num_tokens = n;
        return scatter_head_range(be, ref, a);
      };
      break;
    case Op::kCopyBlocks:
      call = [&] {
        CopyBlocksArgs a;
        a.pairs = dpairs.p;
        a.num_pairs = blocks_used;
        return copy_blocks(be, ref, a);
      };
      break;
  }
  const Status first = call();
  if (!first.ok()) {
    state.SkipWithError(first.to_string().c_str());
    return;
  }
  (void)be.synchronize_stream({});

  // Decode calls go back to back, one synchronisation per burst; the time of a row is a call's.
  const int burst = decode ? kDecodeBurst : 1;
  double op_seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < burst; ++i) (void)call();
    (void)be.synchronize_stream({});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    op_seconds += s;
    state.SetIterationTime(s / burst);
  }
  // The ceiling: one plain copy of the same bytes, same backend, same run, same bursts.
  const int reps = int(std::clamp<int64_t>(state.iterations(), 3, 200));
  const auto copy_once = [&] {
    (void)be.copy_async(copy_dst.p, op == Op::kCopyBlocks ? pool.p : k.p,
                        op == Op::kCopyBlocks ? payload : payload / 2, CopyKind::kDeviceToDevice,
                        {});
    if (op != Op::kCopyBlocks) {
      (void)be.copy_async(static_cast<char*>(copy_dst.p) + payload / 2, v.p, payload / 2,
                          CopyKind::kDeviceToDevice, {});
    }
  };
  copy_once();  // first touch of the destination pages is not part of a copy's cost
  (void)be.synchronize_stream({});
  const double copy_seconds = time_per_call(be, reps, burst, copy_once);
  const double op_per_call = op_seconds / (double(state.iterations()) * burst);
  // Per iteration one call's time (SetIterationTime), so one call's bytes.
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(payload));
  state.counters["vs_copy"] = copy_seconds / op_per_call;
  state.counters["copy_GBps"] = double(payload) / copy_seconds / 1e9;
  state.counters["op_GBps"] = double(payload) / op_per_call / 1e9;
  if (decode) state.counters["vs_empty"] = op_per_call / empty_launch_seconds(be, copy_dst.p, reps);
}

/// One decode step of kStepBatch sequences (a new token each, in a block of its own) into a
/// kStepLayers-layer pool: a write_kv per layer queued back to back (`all_layers` false), or one
/// write_kv_all_layers; one synchronisation per step. The row's time is a launch's; vs_empty is
/// that over an empty launch's (goal <= 1.5 per layer on a GPU); vs_copy is the same bytes' copy
/// (in as many copies as launches) over it.
void run_decode_step(benchmark::State& state, BackendKind kind, bool all_layers) {
  auto be_or = create_backend(kind);
  if (!be_or.ok()) {
    state.SkipWithError(be_or.status().to_string().c_str());
    return;
  }
  Backend& be = **be_or;
  const int64_t n = kStepBatch;
  const int64_t num_blocks = n + 1;
  PoolLayout layout;
  layout.num_layers = kStepLayers;
  layout.num_kv_heads = kHeads;
  layout.head_dim = kHeadDim;
  layout.block_size = kBlockSize;
  const size_t pool_bytes = size_t(num_blocks * layout.block_elems() * 2);
  const size_t layer_bytes = size_t(n * kRowBytes);  // keys (or values) of one layer
  std::mt19937 rng(2);
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) slots[size_t(s)] = int64_t{blocks[size_t(s)]} * kBlockSize + 5;
  // The pool is not filled: a write reads none of it (the warm-up step touches its pages).
  Buf pool(be, pool_bytes), k(be, layer_bytes * kStepLayers), v(be, layer_bytes * kStepLayers),
      dslots(be, slots.size() * 8), copy_dst(be, 2 * layer_bytes * kStepLayers);
  fill(be, k.p, layer_bytes * kStepLayers, 4);
  fill(be, v.p, layer_bytes * kStepLayers, 5);
  upload(be, dslots.p, slots.data(), slots.size() * 8);

  const PoolRef ref{pool.p, kDType, layout, num_blocks};
  const int launches = all_layers ? 1 : kStepLayers;
  const auto step = [&]() -> Status {
    if (all_layers) {
      WriteKvAllLayersArgs a;
      a.key = k.p;
      a.value = v.p;
      a.num_tokens = n;
      a.slot_mapping = static_cast<const int64_t*>(dslots.p);
      return write_kv_all_layers(be, ref, a);
    }
    for (int32_t layer = 0; layer < kStepLayers; ++layer) {
      WriteKvArgs a;
      a.key = static_cast<const char*>(k.p) + layer * layer_bytes;
      a.value = static_cast<const char*>(v.p) + layer * layer_bytes;
      a.num_tokens = n;
      a.slot_mapping = static_cast<const int64_t*>(dslots.p);
      a.layer = layer;
      PAGEDKV_RETURN_IF_ERROR(write_kv(be, ref, a));
    }
    return ok_status();
  };
  const Status first = step();
  if (!first.ok()) {
    state.SkipWithError(first.to_string().c_str());
    return;
  }
  (void)be.synchronize_stream({});

  double op_seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)step();
    (void)be.synchronize_stream({});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    op_seconds += s;
    state.SetIterationTime(s / launches);
  }
  const int reps = int(std::clamp<int64_t>(state.iterations(), 3, 200));
  // The same bytes in as many copy pairs as the step has launches, back to back.
  const size_t copy_bytes = layer_bytes * size_t(kStepLayers / launches);
  int next = 0;
  const auto copy_once = [&] {
    const size_t off = size_t(next++ % launches) * copy_bytes;
    char* dst = static_cast<char*>(copy_dst.p);
    (void)be.copy_async(dst + 2 * off, static_cast<const char*>(k.p) + off, copy_bytes,
                        CopyKind::kDeviceToDevice, {});
    (void)be.copy_async(dst + 2 * off + copy_bytes, static_cast<const char*>(v.p) + off, copy_bytes,
                        CopyKind::kDeviceToDevice, {});
  };
  (void)time_per_call(be, 1, launches, copy_once);  // first touch of the destination pages
  const double copy_seconds = time_per_call(be, reps, launches, copy_once);
  const double per_launch = op_seconds / (double(state.iterations()) * launches);
  const double payload = 2.0 * double(copy_bytes);
  state.SetBytesProcessed(int64_t(double(state.iterations()) * payload));  // a launch's, per launch
  state.counters["vs_empty"] = per_launch / empty_launch_seconds(be, copy_dst.p, reps);
  state.counters["vs_copy"] = copy_seconds / per_launch;
  state.counters["op_GBps"] = payload / per_launch / 1e9;
  state.counters["layers"] = kStepLayers;
}

/// Back-to-back launches of an empty kernel: the floor the decode rows' vs_empty divides by.
void run_empty_launch(benchmark::State& state, BackendKind kind) {
  auto be_or = create_backend(kind);
  if (!be_or.ok()) {
    state.SkipWithError(be_or.status().to_string().c_str());
    return;
  }
  Backend& be = **be_or;
  Buf word(be, 4);
  for (auto _ : state) state.SetIterationTime(empty_launch_seconds(be, word.p, 1));
}

bool has_goal(const std::string& name) {
  return name.find("/decode_step/write_kv/") != std::string::npos ||
         name.find("/prefill/write_kv/") != std::string::npos ||
         name.find("/prefill/gather_layer/") != std::string::npos ||
         name.find("/prefill/copy_blocks/") != std::string::npos;
}

std::string goal_line(const benchmark::BenchmarkReporter::Run& run) {
  const std::string name = run.benchmark_name();
  char line[512];
  if (name.find("/decode_step/write_kv/") != std::string::npos) {
    const double r = run.counters.at("vs_empty").value;
    std::snprintf(line, sizeof line, "%s: %.2fx an empty launch per layer (goal <= %.1f: %s)",
                  name.c_str(), r, kGoalDecodeVsEmpty, r <= kGoalDecodeVsEmpty ? "met" : "NOT met");
  } else {
    const double r = run.counters.at("vs_copy").value;
    std::snprintf(line, sizeof line, "%s: %.2f of the copy (goal >= %.1f: %s)", name.c_str(), r,
                  kGoalPrefillVsCopy, r >= kGoalPrefillVsCopy ? "met" : "NOT met");
  }
  return line;
}

std::string goals_heading() {
  char heading[256];
  std::snprintf(heading, sizeof heading,
                "Goals (read on a GPU; cpu rows are CPU figures): decode write_kv of one layer <= "
                "%gx an empty launch, prefill write_kv, gather_layer, copy_blocks >= %g of a "
                "device-to-device copy",
                kGoalDecodeVsEmpty, kGoalPrefillVsCopy);
  return heading;
}

void register_all() {
  std::vector<BackendKind> kinds = {BackendKind::kCpu};
  if (cuda_device_available()) kinds.push_back(BackendKind::kCuda);
  for (BackendKind kind : kinds) {
    const std::string b = kind == BackendKind::kCpu ? "cpu" : "cuda";
    benchmark::RegisterBenchmark((b + "/launch/empty").c_str(), run_empty_launch, kind)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    for (bool all_layers : {false, true}) {
      const std::string name = all_layers ? "write_kv_all_layers" : "write_kv";
      benchmark::RegisterBenchmark(
          (b + "/decode_step/" + name + "/" + std::to_string(kStepBatch)).c_str(), run_decode_step,
          kind, all_layers)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
    for (Op op : {Op::kWriteKv, Op::kGather, Op::kImport, Op::kCopyBlocks}) {
      benchmark::RegisterBenchmark((b + "/decode/" + op_name(op)).c_str(), run_op, kind, op, true)
          ->Arg(1)
          ->Arg(64)
          ->Arg(512)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
    for (Op op : {Op::kWriteKv, Op::kGather, Op::kImport, Op::kScatter, Op::kCopyBlocks}) {
      benchmark::RegisterBenchmark((b + "/prefill/" + op_name(op)).c_str(), run_op, kind, op, false)
          ->Arg(4096)
          ->Arg(16384)
          ->Arg(65536)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace pagedkv

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--benchmark_min_time", 20) == 0) has_min_time = true;
  }
  static char default_min_time[] = "--benchmark_min_time=0.05";
  if (!has_min_time) args.push_back(default_min_time);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  pagedkv::register_all();
  pagedkv::bench::GoalReporter reporter(benchmark::CreateDefaultDisplayReporter(),
                                        pagedkv::goals_heading(), pagedkv::has_goal,
                                        pagedkv::goal_line);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
