// The null backend: pools far above physical memory cost nothing, copies and kernel launches are
// checked and dropped, events complete at once, and a KvCache on it makes the decisions it makes
// on the CPU backend.
#include "pagedkv/null_backend.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/basic_bodies.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/stats_fields.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// Resident memory of this process in bytes (/proc/self/statm), 0 where it cannot be read.
int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Physical memory of the machine in bytes.
int64_t physical_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

TEST(NullBackend, CreatedByKind) {
  StatusOr<std::unique_ptr<Backend>> b = create_backend(BackendKind::kNull, 3);
  ASSERT_OK(b);
  EXPECT_EQ((*b)->kind(), BackendKind::kNull);
  EXPECT_EQ((*b)->device_ordinal(), 3);
  EXPECT_EQ((*b)->description().rfind("null:", 0), 0u) << (*b)->description();
  EXPECT_STREQ(backend_kind_name(BackendKind::kNull), "null");
}

// 80 GiB of device memory and 64 GiB of pinned memory, together far above this machine's memory,
// are handed out, and untouched they take (almost) no resident memory.
TEST(NullBackend, PoolsFarAbovePhysicalMemoryCostNoMemory) {
  std::unique_ptr<Backend> b = create_null_backend();
  const size_t device = 80 * kGiB, pinned = 64 * kGiB;
  ASSERT_GT(static_cast<int64_t>(device + pinned), physical_bytes());
  const int64_t before = resident_bytes();
  StatusOr<void*> d = b->allocate_device(device);
  ASSERT_OK(d);
  StatusOr<void*> h = b->allocate_pinned(pinned);
  ASSERT_OK(h);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*d) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*h) % 256, 0u);
  EXPECT_LT(resident_bytes() - before, int64_t{64} << 20);
  // Pinned memory is host memory the runtime may write (staging): a written page is real.
  static_cast<char*>(*h)[pinned - 1] = 7;
  EXPECT_EQ(static_cast<char*>(*h)[pinned - 1], 7);
  StatusOr<void*> mapped = b->mapped_device_pointer(static_cast<char*>(*h) + 100);
  ASSERT_OK(mapped);
  EXPECT_EQ(*mapped, static_cast<char*>(*h) + 100);
  EXPECT_EQ(b->mapped_device_pointer(*d).status().code(), StatusCode::kInvalidArgument);
  b->free_device(*d);
  b->free_pinned(*h);
  EXPECT_EQ(b->allocate_device(0).status().code(), StatusCode::kInvalidArgument);
}

// Copies (one and batched, every kind) and a kernel launch leave their destination as it was,
// and the events recorded after them are complete at once.
TEST(NullBackend, CopiesAndLaunchesDoNothing) {
  std::unique_ptr<Backend> b = create_null_backend();
  constexpr size_t kWords = 1024;
  StatusOr<void*> dst = b->allocate_device(kWords * 4);
  StatusOr<void*> src = b->allocate_pinned(kWords * 4);
  ASSERT_OK(dst);
  ASSERT_OK(src);
  auto* d = static_cast<uint32_t*>(*dst);
  auto* s = static_cast<uint32_t*>(*src);
  for (size_t i = 0; i < kWords; ++i) {
    d[i] = 0xdead0000u + static_cast<uint32_t>(i);  // poison
    s[i] = static_cast<uint32_t>(i * 2654435761u) | 1u;
  }
  StatusOr<Stream> stream = b->create_stream(StreamPriority::kLow);
  ASSERT_OK(stream);
  for (CopyKind kind : {CopyKind::kHostToDevice, CopyKind::kDeviceToDevice, CopyKind::kDeviceToHost,
                        CopyKind::kHostToHost}) {
    EXPECT_OK(b->copy_async(d, s, kWords * 4, kind, *stream));
    const CopyRegion regions[] = {{d, s, 64}, {d + 100, s + 100, 128}};
    EXPECT_OK(b->copy_batch(regions, 2, kind, Stream{}));
  }
  kernels::FillBody fill{d, 42u};
  EXPECT_OK(b->launch(KernelLaunch{KernelId::kFill, &fill, sizeof(fill), kWords}, *stream));
  StatusOr<Event> event = b->create_event();
  ASSERT_OK(event);
  ASSERT_OK(b->record_event(*event, *stream));
  StatusOr<bool> done = b->query_event(*event);
  ASSERT_OK(done);
  EXPECT_TRUE(*done);
  EXPECT_OK(b->wait_event(Stream{}, *event));
  EXPECT_OK(b->synchronize_stream(*stream));
  for (size_t i = 0; i < kWords; ++i)
    ASSERT_EQ(d[i], 0xdead0000u + static_cast<uint32_t>(i)) << "word " << i;
  // A host function runs (at once: nothing queued before it is pending).
  bool ran = false;
  EXPECT_OK(b->launch_host_func(*stream, [&ran] { ran = true; }));
  EXPECT_TRUE(ran);
  b->destroy_event(*event);
  b->destroy_stream(*stream);
  b->free_device(*dst);
  b->free_pinned(*src);
}

// The calls check their arguments as the other backends do.
TEST(NullBackend, RefusesBadArguments) {
  std::unique_ptr<Backend> b = create_null_backend();
  uint32_t word = 0;
  kernels::FillBody fill{&word, 1u};
  EXPECT_EQ(b->copy_async(nullptr, &word, 4, CopyKind::kHostToHost, Stream{}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->copy_async(&word, &word, 4, CopyKind::kHostToHost, Stream{&word}).code(),
            StatusCode::kInvalidArgument);
  const CopyRegion bad{nullptr, &word, 4};
  EXPECT_EQ(b->copy_batch(&bad, 1, CopyKind::kHostToHost, Stream{}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->launch(KernelLaunch{KernelId::kFill, &fill, sizeof(fill) - 1, 1}, Stream{}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->launch(KernelLaunch{KernelId::kFill, &fill, sizeof(fill), -1}, Stream{}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->query_event(Event{&word}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->wrap_stream(nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(word, 0u);
  // A wrapped stream names the caller's handle, and the same handle gives the same stream.
  StatusOr<Stream> w = b->wrap_stream(&word);
  ASSERT_OK(w);
  StatusOr<Stream> again = b->wrap_stream(&word);
  ASSERT_OK(again);
  EXPECT_EQ(*w, *again);
  StatusOr<void*> native = b->native_stream(*w);
  ASSERT_OK(native);
  EXPECT_EQ(*native, &word);
}

// A KvCache with an 80 GiB device pool and a 64 GiB host pool is created on the null backend and
// runs sequences; the process stays far below the pools' size.
TEST(NullBackend, KvCacheWithFullSizePools) {
  CacheConfig c;
  c.num_layers = 80;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.block_size = 16;
  c.backend = BackendKind::kNull;
  c.num_device_blocks = static_cast<int64_t>(80 * kGiB) / c.block_bytes();
  c.num_host_blocks = static_cast<int64_t>(64 * kGiB) / c.block_bytes();
  const int64_t before = resident_bytes();
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::create(c);
  ASSERT_OK(cache);
  KvCache& kv = **cache;
  EXPECT_EQ(kv.backend().kind(), BackendKind::kNull);
  std::vector<TokenId> prompt(1000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(i * 7 + 1);
  for (SequenceId id = 1; id <= 8; ++id) {
    ASSERT_OK(kv.add_sequence(id, prompt));
    ASSERT_OK(kv.reserve(id, 16));
  }
  ASSERT_OK(kv.build_batch({1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_OK(kv.offload(8));
  ASSERT_OK(kv.restore(8));
  ASSERT_OK(kv.synchronize());
  ASSERT_OK(kv.check_invariants());
  EXPECT_LT(resident_bytes() - before, int64_t{1} << 30);
}

// One random sequence of cache calls, applied to a cache on the CPU backend and one on the null
// backend: every call gives the same status, and after it both have the same committed lengths,
// the same blocks (tier and id, in every group) and the same stats.
// `cpu_options` shape the CPU backend (copy delays: the decisions must not depend on how long
// the copies take).
void run_same_decisions(const CacheConfig& base, uint64_t seed,
                        const CpuBackendOptions& cpu_options = {}) {
  std::unique_ptr<Backend> cpu_backend = create_cpu_backend(cpu_options);
  std::map<BackendKind, std::unique_ptr<KvCache>> caches;
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kNull}) {
    CacheConfig c = base;
    c.backend = kind;
    KvCacheOptions options;
    if (kind == BackendKind::kCpu) options.backend = cpu_backend.get();
    StatusOr<std::unique_ptr<KvCache>> made = KvCache::create(c, options);
    ASSERT_OK(made);
    caches[kind] = std::move(made).value();
  }
  KvCache& cpu = *caches[BackendKind::kCpu];
  KvCache& null = *caches[BackendKind::kNull];
  std::mt19937_64 rng(seed);
  auto pick = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<std::vector<TokenId>> prefixes(3);
  for (auto& p : prefixes) {
    p.resize(static_cast<size_t>(pick(4, 24)));
    for (TokenId& t : p) t = static_cast<TokenId>(pick(1, 1000));
  }
  constexpr SequenceId kIds = 8;
  // Each sequence commits its prompt's tokens first (so its full blocks are the prompt's and
  // later prompts hit them), then random ones.
  std::map<SequenceId, std::vector<TokenId>> prompts;
  int64_t compared_blocks = 0;
  for (int step = 0; step < 1500; ++step) {
    const SequenceId id = pick(1, kIds);
    const int op = static_cast<int>(pick(0, 11));
    std::string what;
    Status a, b;
    auto both = [&](const std::string& name, auto&& call) {
      what = name + " " + std::to_string(id);
      a = call(cpu);
      b = call(null);
    };
    if (op <= 1) {
      std::vector<TokenId> prompt = prefixes[static_cast<size_t>(pick(0, 2))];
      for (int64_t n = pick(1, 12); n > 0; --n)
        prompt.push_back(static_cast<TokenId>(pick(1, 1000)));
      both("add", [&](KvCache& k) { return k.add_sequence(id, prompt).status(); });
      if (a.ok()) prompts[id] = prompt;
    } else if (op <= 4) {
      const int64_t n = pick(1, 6);
      both("reserve", [&](KvCache& k) { return k.reserve(id, n).status(); });
    } else if (op <= 6) {
      StatusOr<int64_t> pending = cpu.pending(id);
      const int64_t n = pending.ok() ? pick(0, *pending) : 1;
      const int64_t len = cpu.length(id).ok() ? cpu.length(id).value() : 0;
      const std::vector<TokenId>& prompt = prompts[id];
      std::vector<TokenId> tokens(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const size_t at = static_cast<size_t>(len + i);
        tokens[static_cast<size_t>(i)] =
            at < prompt.size() ? prompt[at] : static_cast<TokenId>(pick(1, 1000));
      }
      both("commit", [&](KvCache& k) { return k.commit(id, tokens); });
    } else if (op == 7) {
      StatusOr<int64_t> len = cpu.length(id);
      const int64_t to = len.ok() ? pick(0, *len) : 0;
      both("rollback", [&](KvCache& k) { return k.rollback(id, to); });
    } else if (op == 8) {
      const SequenceId child = pick(1, kIds);
      both("fork", [&](KvCache& k) { return k.fork(id, child); });
      if (a.ok()) prompts[child] = prompts[id];
    } else if (op == 9) {
      if (pick(0, 1) == 0) {
        both("finish", [&](KvCache& k) { return k.finish(id); });
      } else {
        both("erase", [&](KvCache& k) { return k.erase(id); });
      }
    } else if (op == 10) {
      both(pick(0, 1) == 0 ? "offload" : "restore", [&](KvCache& k) {
        return what.rfind("offload", 0) == 0 ? k.offload(id) : k.restore(id);
      });
    } else {
      // A step over the live sequences on the device: some active, the batch built.
      std::vector<SequenceId> active;
      for (SequenceId s = 1; s <= kIds; ++s) {
        StatusOr<SequenceResidency> r = cpu.residency(s);
        (void)null.residency(s);  // the same calls on both (a residency query polls transfers)
        if (r.ok() && *r == SequenceResidency::kDevice && pick(0, 1) == 1) active.push_back(s);
      }
      both("step", [&](KvCache& k) {
        PAGEDKV_RETURN_IF_ERROR(k.set_active(active));
        return k.build_batches(active).status();
      });
    }
    ASSERT_EQ(a.code(), b.code()) << "step " << step << " " << what << ": cpu " << a.to_string()
                                  << ", null " << b.to_string();
    ASSERT_EQ(cpu.drain_evicted_sequences(), null.drain_evicted_sequences()) << what;
    ASSERT_EQ(stat_values(cpu.stats()), stat_values(null.stats()))
        << "step " << step << " " << what;
    for (SequenceId s = 1; s <= kIds; ++s) {
      ASSERT_EQ(cpu.contains(s), null.contains(s)) << s;
      if (!cpu.contains(s)) continue;
      ASSERT_EQ(cpu.length(s).value(), null.length(s).value()) << s;
      ASSERT_EQ(cpu.pending(s).value(), null.pending(s).value()) << s;
      for (int32_t g = 0; g < cpu.num_groups(); ++g) {
        StatusOr<std::vector<BlockLocation>> x = cpu.block_locations(s, g);
        StatusOr<std::vector<BlockLocation>> y = null.block_locations(s, g);
        ASSERT_OK(x);
        ASSERT_OK(y);
        ASSERT_EQ(x->size(), y->size()) << "step " << step << " sequence " << s;
        for (size_t i = 0; i < x->size(); ++i)
          ASSERT_TRUE((*x)[i] == (*y)[i]) << "step " << step << " sequence " << s << " block " << i;
        compared_blocks += static_cast<int64_t>(x->size());
      }
    }
  }
  ASSERT_OK(cpu.synchronize());
  ASSERT_OK(null.synchronize());
  EXPECT_OK(cpu.check_invariants());
  EXPECT_OK(null.check_invariants());
  // The run moved blocks between tiers and reused cached ones, so the decisions compared above
  // were not all trivial.
  const ControlStats st = cpu.stats();
  EXPECT_GT(st.blocks_offloaded + st.blocks_restored, 0);
  EXPECT_GT(st.prefix_hit_blocks, 0);
  EXPECT_GT(compared_blocks, 1000);
}

CacheConfig small_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.block_size = 4;
  c.num_device_blocks = 24;
  c.num_host_blocks = 32;
  return c;
}

TEST(NullBackend, KvCacheMakesTheCpuBackendsDecisions) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    run_same_decisions(small_config(), seed);
  }
  // Copies that lag on the CPU backend's copy streams (transfers still in flight at the next
  // call) change nothing either.
  CpuBackendOptions slow;
  slow.copy_delay = std::chrono::microseconds(200);
  run_same_decisions(small_config(), 6, slow);
}

// The same with two KV groups (full attention and a window of 8 tokens) on shared blocks.
TEST(NullBackend, KvCacheWithGroupsMakesTheCpuBackendsDecisions) {
  CacheConfig c = small_config();
  KvGroup full, window;
  full.name = "full";
  full.layers = {1};
  window.name = "window";
  window.layers = {0};
  window.sliding_window = 8;
  for (KvGroup* g : {&full, &window}) {
    g->num_kv_heads = 2;
    g->head_dim = 16;
    g->num_device_blocks = 24;
    g->num_host_blocks = 32;
  }
  c.groups = {full, window};
  for (uint64_t seed : {4u, 5u}) {
    SCOPED_TRACE(seed);
    run_same_decisions(c, seed);
  }
}

}  // namespace
}  // namespace pagedkv
