// The same randomized workload (tools/soak/kv_workload.hpp) on two backends gives bit-identical
// pools and reads: the device pool and the host pool byte for byte (every allocation starts
// from the same bytes), every device-resident sequence's gathered layers, block locations and
// stats. CPU against CUDA where a device is present; CPU against a CPU backend with delayed
// copies everywhere (so the comparison itself is exercised, and shown able to fail, without a
// GPU). Also: with a device present, the automatic backend choice is CUDA, so a GPU run cannot
// pass on the CPU backend alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kv_workload.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "runtime/runtime_backends.hpp"
#include "support/backend_test.hpp"
#include "support/forwarding_backend.hpp"
#include "support/named_stats.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using soak::KvWorkload;
using soak::WorkloadOptions;

constexpr int64_t kSteps = 3000;

// Forwards every call to another backend. Every allocation is filled with the same bytes (a
// function of its size and of how many allocations came before), so two runs on different
// backends start from identical memory; the pinned allocations are remembered (pinned memory is
// host memory on both backends).
class FilledAllocBackend final : public testing::ForwardingBackend {
 public:
  explicit FilledAllocBackend(Backend& inner) : ForwardingBackend(inner) {}

  /// The pinned allocation of exactly `bytes` bytes made last, or null.
  const uint8_t* pinned_of_size(size_t bytes) const {
    for (auto it = pinned_.rbegin(); it != pinned_.rend(); ++it) {
      if (it->second == bytes) return static_cast<const uint8_t*>(it->first);
    }
    return nullptr;
  }

  std::string description() const override { return "filled " + inner().description(); }
  StatusOr<void*> allocate_device(size_t bytes) override {
    auto p = inner().allocate_device(bytes);
    if (!p.ok()) return p;
    const std::vector<uint8_t> fill = pattern(bytes);
    PAGEDKV_RETURN_IF_ERROR(
        inner().copy_async(*p, fill.data(), bytes, CopyKind::kHostToDevice, Stream{}));
    PAGEDKV_RETURN_IF_ERROR(inner().synchronize_stream(Stream{}));
    return p;
  }
  StatusOr<void*> allocate_pinned(size_t bytes) override {
    auto p = inner().allocate_pinned(bytes);
    if (!p.ok()) return p;
    const std::vector<uint8_t> fill = pattern(bytes);
    std::memcpy(*p, fill.data(), bytes);
    pinned_.emplace_back(*p, bytes);
    return p;
  }
  void free_pinned(void* ptr) override {
    pinned_.erase(std::remove_if(pinned_.begin(), pinned_.end(),
                                 [ptr](const auto& a) { return a.first == ptr; }),
                  pinned_.end());
    inner().free_pinned(ptr);
  }
  // Everything else is forwarded, mapped_device_pointer included, so that both runs move blocks
  // with the copy kernel (the workload's blocks are small) and the comparison covers it.

 private:
  std::vector<uint8_t> pattern(size_t bytes) {
    std::vector<uint8_t> v(bytes);
    uint64_t x = 0x9e3779b97f4a7c15ull * ++allocations_ + bytes;
    for (auto& b : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<uint8_t>(x >> 56);
    }
    return v;
  }

  uint64_t allocations_ = 0;
  std::vector<std::pair<void*, size_t>> pinned_;
};

// What a run leaves: both pools, and per live sequence its locations and (device-resident) every
// gathered layer, K then V.
struct RunResult {
  std::string problem;  // "" when the run itself was clean
  std::vector<uint8_t> device_pool;
  std::vector<uint8_t> host_pool;
  std::vector<std::pair<SequenceId, std::string>> locations;
  std::vector<std::pair<SequenceId, std::vector<uint8_t>>> reads;
  testing::NamedStats stats;
};

std::vector<uint8_t> download(Backend& b, const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  EXPECT_OK(b.copy_async(out.data(), src, bytes, CopyKind::kDeviceToHost, Stream{}));
  EXPECT_OK(b.synchronize_stream(Stream{}));
  return out;
}

// Runs kSteps ops of seed `seed` on `backend` and collects the result.
RunResult run_on(Backend& inner, uint64_t seed) {
  RunResult r;
  FilledAllocBackend filled(inner);
  WorkloadOptions options;
  options.seed = seed;
  options.backend = &filled;
  auto created = KvWorkload::create(options);
  if (!created.ok()) {
    r.problem = created.status().to_string();
    return r;
  }
  KvWorkload& w = **created;
  w.run(kSteps);
  w.verify_all();
  const soak::WorkloadCounters& c = w.counters();
  if (c.mismatches + c.invariant_failures + c.errors != 0 || c.ops != kSteps) {
    r.problem = "workload: " + std::to_string(c.ops) + " ops, " + std::to_string(c.mismatches) +
                " mismatches, " + std::to_string(c.errors) + " errors; " + c.first_problem;
    return r;
  }
  KvCache& cache = w.cache();
  if (!cache.pool_info().transfer_kernel) {
    r.problem = "the workload's small blocks did not take the copy kernel";
    return r;
  }
  if (!cache.synchronize().ok()) {
    r.problem = "synchronize failed";
    return r;
  }
  const CacheConfig& config = cache.config();
  r.device_pool = download(filled, cache.device_pool().data,
                           static_cast<size_t>(cache.pool_info().device_bytes));
  const size_t host_bytes = static_cast<size_t>(cache.pool_info().host_bytes);
  if (const uint8_t* host = filled.pinned_of_size(host_bytes)) {
    r.host_pool.assign(host, host + host_bytes);
  } else {
    r.problem = "no pinned allocation of the host pool's size";
    return r;
  }
  std::vector<SequenceId> ids = w.live_sequences();
  std::sort(ids.begin(), ids.end());
  for (SequenceId id : ids) {
    std::ostringstream os;
    for (const BlockLocation& b : cache.block_locations(id).value_or({})) {
      os << (b.tier == Tier::kDevice ? " d" : " h") << b.block;
    }
    r.locations.emplace_back(id, os.str());
    if (cache.residency(id).value_or(SequenceResidency::kHost) != SequenceResidency::kDevice) {
      continue;
    }
    const int64_t n = cache.length(id).value_or(0);
    const size_t bytes =
        static_cast<size_t>(n * config.num_kv_heads * config.head_dim) * dtype_size(config.dtype);
    if (bytes == 0) continue;
    std::vector<uint8_t> read;
    testing::DeviceBuffer k(filled, bytes), v(filled, bytes);
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      EXPECT_OK(cache.gather_layer(id, layer, k.data(), v.data(), config.dtype,
                                   PackedLayout::kHeadMajor));
      EXPECT_OK(cache.synchronize());
      for (testing::DeviceBuffer* b : {&k, &v}) {
        const std::vector<uint8_t> part = b->download<uint8_t>();
        read.insert(read.end(), part.begin(), part.end());
      }
    }
    r.reads.emplace_back(id, std::move(read));
  }
  r.stats = testing::named_stats(cache.stats());
  return r;
}

// "" when equal, else the first difference.
std::string first_difference(const RunResult& a, const RunResult& b, int64_t block_bytes) {
  auto bytes = [&](const char* what, const std::vector<uint8_t>& x,
                   const std::vector<uint8_t>& y) -> std::string {
    if (x.size() != y.size()) {
      return std::string(what) + ": sizes " + std::to_string(x.size()) + " and " +
             std::to_string(y.size());
    }
    const auto m = std::mismatch(x.begin(), x.end(), y.begin());
    if (m.first == x.end()) return "";
    const int64_t at = m.first - x.begin();
    return std::string(what) + ": byte " + std::to_string(at) + " (block " +
           std::to_string(at / block_bytes) + ") is " + std::to_string(*m.first) + " and " +
           std::to_string(*m.second);
  };
  std::string d = bytes("device pool", a.device_pool, b.device_pool);
  if (d.empty()) d = bytes("host pool", a.host_pool, b.host_pool);
  if (!d.empty()) return d;
  if (a.locations != b.locations) return "block locations differ";
  if (a.reads.size() != b.reads.size()) return "different device-resident sequences";
  for (size_t i = 0; i < a.reads.size(); ++i) {
    if (a.reads[i].first != b.reads[i].first) return "different device-resident sequences";
    d = bytes(("reads of seq " + std::to_string(a.reads[i].first)).c_str(), a.reads[i].second,
              b.reads[i].second);
    if (!d.empty()) return d;
  }
  return testing::stats_diff(a.stats, b.stats);
}

int64_t block_bytes() { return soak::pressure_config().block_bytes(); }

// The comparison is what it says: identical runs compare equal (on two differently timed CPU
// backends), both pools are compared in full, reads happened, and one changed byte is seen.
TEST(CrossBackend, CpuAndDelayedCpuGiveBitIdenticalPoolsAndReads) {
  std::unique_ptr<Backend> cpu = create_cpu_backend();
  CpuBackendOptions delayed;
  delayed.copy_delay = std::chrono::microseconds(20);
  delayed.kernel_delay = std::chrono::microseconds(5);
  delayed.run_inline_when_idle = false;
  std::unique_ptr<Backend> slow = create_cpu_backend(delayed);
  const RunResult a = run_on(*cpu, 21);
  const RunResult b = run_on(*slow, 21);
  ASSERT_EQ(a.problem, "");
  ASSERT_EQ(b.problem, "");
  EXPECT_EQ(static_cast<int64_t>(a.device_pool.size()),
            soak::pressure_config().num_device_blocks * block_bytes());
  EXPECT_EQ(static_cast<int64_t>(a.host_pool.size()),
            soak::pressure_config().num_host_blocks * block_bytes());
  EXPECT_GE(a.reads.size(), 2u) << "too few device-resident sequences to compare reads";
  EXPECT_EQ(first_difference(a, b, block_bytes()), "");

  RunResult changed = b;
  changed.host_pool[changed.host_pool.size() / 2] ^= 0x10;
  EXPECT_NE(first_difference(a, changed, block_bytes()).find("host pool: byte"), std::string::npos);
  changed = b;
  changed.reads.back().second.front() ^= 0x01;
  EXPECT_NE(first_difference(a, changed, block_bytes()).find("reads of seq"), std::string::npos);
}

// The same workload on the CPU backend and on the device gives the same bytes everywhere.
TEST(CrossBackend, CpuAndCudaGiveBitIdenticalPoolsAndReads) {
  testing::require_backend(BackendKind::kCuda);
  if (IsSkipped() || HasFatalFailure()) return;
  std::unique_ptr<Backend> cpu = create_cpu_backend();
  std::unique_ptr<Backend> cuda = testing::make_backend(BackendKind::kCuda);
  ASSERT_NE(cuda, nullptr);
  for (uint64_t seed : {21u, 22u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const RunResult a = run_on(*cpu, seed);
    const RunResult b = run_on(*cuda, seed);
    ASSERT_EQ(a.problem, "");
    ASSERT_EQ(b.problem, "");
    EXPECT_GE(a.reads.size(), 2u);
    EXPECT_EQ(first_difference(a, b, block_bytes()), "");
  }
}

// With a device present, nothing falls back to the CPU: the automatic choice, and a cache
// created with it, run on CUDA. Without one, skipped (failed under PAGEDKV_REQUIRE_CUDA=1).
TEST(CrossBackend, CudaIsTheAutomaticChoiceWhenADeviceIsPresent) {
  testing::require_backend(BackendKind::kCuda);
  if (IsSkipped() || HasFatalFailure()) return;
  auto backend = create_backend(BackendKind::kAuto);
  ASSERT_OK(backend);
  EXPECT_EQ((*backend)->kind(), BackendKind::kCuda) << (*backend)->description();
  CacheConfig c = soak::pressure_config();
  c.backend = BackendKind::kAuto;
  auto cache = KvCache::create(c);
  ASSERT_OK(cache);
  EXPECT_EQ((*cache)->backend().kind(), BackendKind::kCuda) << (*cache)->backend().description();
}

}  // namespace
}  // namespace pagedkv
