// Data-plane op throughput at decode and prefill sizes, against a plain copy of the same bytes
// measured in the same run (memcpy on the CPU backend, device-to-device cudaMemcpy on CUDA:
// both through Backend::copy_async). Counters: bytes_per_second (K+V payload), vs_copy (op
// throughput / copy throughput). Model shape: 8 KV heads x 128 dim, fp16, 2 layers, block 16.
//
// Runs on the CPU backend always and on CUDA when a device is present. Default min time is
// short (0.05 s per benchmark); pass --benchmark_min_time to change it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

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

/// Seconds per call of `fn` followed by a stream synchronisation, over `reps` calls.
double time_per_call(Backend& be, int reps, const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  (void)be.synchronize_stream({});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
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
  std::vector<uint8_t> noise(std::max(pool_bytes, payload / 2));
  for (auto& b : noise) b = static_cast<uint8_t>(rng() & 0x3f);  // finite fp16 bit patterns
  upload(be, pool.p, noise.data(), pool_bytes);
  upload(be, k.p, noise.data(), payload / 2);
  upload(be, v.p, noise.data(), payload / 2);
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

  double op_seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)call();
    (void)be.synchronize_stream({});
    op_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // The ceiling: one plain copy of the same bytes, same backend, same run.
  const int reps = int(std::clamp<int64_t>(state.iterations(), 3, 200));
  const auto copy_once = [&] {
    (void)be.copy_async(copy_dst.p, op == Op::kCopyBlocks ? pool.p : k.p,
                        op == Op::kCopyBlocks ? payload : payload / 2, CopyKind::kDeviceToDevice,
                        {});
    if (op != Op::kCopyBlocks) {
      (void)be.copy_async(static_cast<char*>(copy_dst.p) + payload / 2, v.p, payload / 2,
                          CopyKind::kDeviceToDevice, {});
    }
    (void)be.synchronize_stream({});
  };
  copy_once();  // first touch of the destination pages is not part of a copy's cost
  const double copy_seconds = time_per_call(be, reps, copy_once);
  const double op_per_call = op_seconds / double(state.iterations());
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(payload));
  state.counters["vs_copy"] = copy_seconds / op_per_call;
  state.counters["copy_GBps"] = double(payload) / copy_seconds / 1e9;
  state.counters["op_GBps"] = double(payload) / op_per_call / 1e9;
}

void register_all() {
  std::vector<BackendKind> kinds = {BackendKind::kCpu};
  if (cuda_device_available()) kinds.push_back(BackendKind::kCuda);
  for (BackendKind kind : kinds) {
    const std::string b = kind == BackendKind::kCpu ? "cpu" : "cuda";
    for (Op op : {Op::kWriteKv, Op::kGather, Op::kImport, Op::kCopyBlocks}) {
      benchmark::RegisterBenchmark((b + "/decode/" + op_name(op)).c_str(), run_op, kind, op, true)
          ->Arg(1)
          ->Arg(64)
          ->Arg(512)
          ->UseRealTime()
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
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
