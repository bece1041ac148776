// A continuous-batching replay through KvCache or SeedKvCache on the CPU backend, against the
// seed's Rust KvCache replaying the same trace (benchmarks/seed_replay, scripts/bench-seed-replay
// runs both and compares). The trace and the workload: replay_trace.hpp, replay_workload.hpp.
//
//   pagedkv_bench_replay --generate=small|large --out=FILE    writes a trace
//   pagedkv_bench_replay --trace=FILE --api=kvcache|seed       replays it
//
// Only cache calls are timed (wall and process CPU time): making K/V inputs and summing what
// was read are not. memcpy_ms is the ceiling, a memcpy of the bytes written and read, timed in
// the same run; vs_memcpy = memcpy_ms / wall_ms (1.0: the cache calls cost a plain copy). Each op's
// calls end with synchronize(), so the time covers the work done, not just queued. Prints one line,
// the same fields as the Rust side:
//   replay impl=<api> model=<name> wall_ms=... cpu_ms=... <op>_ms=... reads=... checksum=0x...
// `faults` counts page faults in the timed part (none expected: the warm-up faults the pool in).
// Every read is also compared with the values the trace says were written (--no-verify skips
// that); a mismatch or a failed call exits 1.
//
// How the seed's calls map: the seed (and SeedKvCache) prefills with append_token per (layer,
// position), layer by layer, then advance_sequence_by; decodes with set_active_sequences, an
// append_token per (layer, sequence), then advance_sequence per sequence; reads with
// get_packed_layer. KvCache does what a server does: add_sequence, one reserve, a write_kv per
// layer and a commit for a prompt; set_active, reserve_batch, build_batch, a write_kv_batch per
// layer and commit_batch for a decode step; gather_layer (head-major, the seed's packed layout)
// into the caller's buffer for a read.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "benchmarks/replay_trace.hpp"
#include "benchmarks/replay_workload.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/seed_cache.hpp"

namespace pagedkv::bench::replay {
namespace {

using Clock = std::chrono::steady_clock;

// Page faults so far: the timed part should take none (the warm-up faults the pool in).
int64_t page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt + u.ru_majflt;
}

int64_t process_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Where the timed part's time went, by op kind.
struct Timing {
  bool on = false;
  double wall_ms[kOpKinds] = {};
  int64_t cpu_ns = 0;
  Clock::time_point t0;
  int64_t c0 = 0;
  void start() {
    c0 = process_cpu_ns();
    t0 = Clock::now();
  }
  void stop(OpKind kind) {
    const auto t1 = Clock::now();
    const int64_t c1 = process_cpu_ns();
    if (!on) return;
    wall_ms[static_cast<int>(kind)] += std::chrono::duration<double, std::milli>(t1 - t0).count();
    cpu_ns += c1 - c0;
  }
};

// A sequence as the trace made it: its tokens and their chain values (replay_trace.hpp).
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> chain;
  void push(int32_t token) {
    const uint64_t prev = chain.empty() ? kChainStart : chain.back();
    chain.push_back(chain_next(prev, static_cast<uint64_t>(token), tokens.size()));
    tokens.push_back(token);
  }
};

// A packed layer read back: [heads, length, head_dim] keys and values, `head_stride` elements
// between heads, in host-readable memory (the CPU backend's device memory is host memory).
struct Packed {
  const uint16_t* key = nullptr;
  const uint16_t* value = nullptr;
  int64_t length = 0;
  int64_t head_stride = 0;
};

// The calls of one API; the Replayer does the rest. `k`/`v` hold the op's inputs, made before
// the timed calls: for an admit [layer][position - cached][heads * head_dim], for a decode
// [layer][sequence][heads * head_dim]. An admit's cache lookup is timed apart from its writes,
// since the inputs depend on what it found cached.
class Api {
 public:
  virtual ~Api() = default;
  virtual const char* name() const = 0;
  virtual StatusOr<int64_t> add(uint64_t id, const std::vector<TokenId>& prompt) = 0;
  virtual Status prefill(uint64_t id, const Seq& s, int64_t cached, const uint16_t* k,
                         const uint16_t* v) = 0;
  virtual Status decode(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                        const std::vector<int64_t>& positions, const uint16_t* k,
                        const uint16_t* v) = 0;
  virtual StatusOr<Packed> read(uint64_t id, int32_t layer) = 0;
  virtual Status rollback(uint64_t id, int64_t length) = 0;
  virtual Status finish(uint64_t id) = 0;
  // Where inputs go: the CPU backend's device memory, which the host can fill.
  virtual uint16_t* input(int kv) = 0;
};

CacheConfig make_config(const Model& m) {
  CacheConfig c;
  c.num_layers = m.layers;
  c.num_kv_heads = m.heads;
  c.head_dim = m.head_dim;
  c.block_size = m.block_size;
  c.num_device_blocks = m.blocks;
  c.num_host_blocks = 0;  // the seed offloads only when the pool runs out, which this trace never
  c.eviction_policy = EvictionPolicy::kLru;  // the seed's LruInactive
  c.backend = BackendKind::kCpu;
  return c;
}

// Device buffers of the CPU backend, freed with it.
class Buffers {
 public:
  explicit Buffers(Backend& be) : be_(be) {}
  ~Buffers() {
    for (void* p : ptrs_) be_.free_device(p);
  }
  StatusOr<uint16_t*> get(size_t elems) {
    PAGEDKV_ASSIGN_OR_RETURN(void* p, be_.allocate_device(elems * 2));
    ptrs_.push_back(p);
    return static_cast<uint16_t*>(p);
  }

 private:
  Backend& be_;
  std::vector<void*> ptrs_;
};

class KvCacheApi final : public Api {
 public:
  static StatusOr<std::unique_ptr<Api>> create(const Model& m, size_t input_elems,
                                               size_t gather_elems) {
    auto api = std::unique_ptr<KvCacheApi>(new KvCacheApi(m));
    KvCacheOptions options;
    options.enable_events = false;  // nobody drains them here, and the seed has none
    PAGEDKV_ASSIGN_OR_RETURN(api->cache_, KvCache::create(make_config(m), options));
    api->buffers_ = std::make_unique<Buffers>(api->cache_->backend());
    for (int kv = 0; kv < 2; ++kv) {
      PAGEDKV_ASSIGN_OR_RETURN(api->in_[kv], api->buffers_->get(input_elems));
      PAGEDKV_ASSIGN_OR_RETURN(api->out_[kv], api->buffers_->get(gather_elems));
      // Faulted in now: a server's read buffers are long-lived, and first touches are not the
      // cache's work.
      std::memset(api->out_[kv], 0, gather_elems * 2);
    }
    return std::unique_ptr<Api>(std::move(api));
  }
  const char* name() const override { return "kvcache"; }
  uint16_t* input(int kv) override { return in_[kv]; }

  StatusOr<int64_t> add(uint64_t id, const std::vector<TokenId>& prompt) override {
    return cache_->add_sequence(id, prompt);
  }
  Status prefill(uint64_t id, const Seq& s, int64_t cached, const uint16_t* k,
                 const uint16_t* v) override {
    const int64_t n = static_cast<int64_t>(s.tokens.size()) - cached;
    one_[0] = id;
    PAGEDKV_RETURN_IF_ERROR(cache_->reserve_batch_into(one_, n, nullptr));
    for (int32_t l = 0; l < m_.layers; ++l) {
      const size_t at = static_cast<size_t>(l) * n * row_;
      PAGEDKV_RETURN_IF_ERROR(cache_->write_kv(id, l, k + at, v + at, DType::kFloat16));
    }
    tokens_.assign(s.tokens.begin() + cached, s.tokens.end());
    PAGEDKV_RETURN_IF_ERROR(cache_->commit(id, tokens_));
    return cache_->synchronize();
  }
  Status decode(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                const std::vector<int64_t>& /*positions*/, const uint16_t* k,
                const uint16_t* v) override {
    PAGEDKV_RETURN_IF_ERROR(cache_->set_active(ids));
    PAGEDKV_RETURN_IF_ERROR(cache_->reserve_batch_into(ids, 1, nullptr));
    PAGEDKV_ASSIGN_OR_RETURN(const DeviceBatch batch, cache_->build_batch(ids));
    for (int32_t l = 0; l < m_.layers; ++l) {
      const size_t at = static_cast<size_t>(l) * ids.size() * row_;
      PAGEDKV_RETURN_IF_ERROR(cache_->write_kv_batch(batch, l, k + at, v + at, DType::kFloat16));
    }
    PAGEDKV_RETURN_IF_ERROR(cache_->commit_batch(ids, tokens));
    return cache_->synchronize();
  }
  StatusOr<Packed> read(uint64_t id, int32_t layer) override {
    PAGEDKV_ASSIGN_OR_RETURN(const int64_t len, cache_->length(id));
    PAGEDKV_RETURN_IF_ERROR(cache_->gather_layer(id, layer, out_[0], out_[1], DType::kFloat16,
                                                 PackedLayout::kHeadMajor));
    PAGEDKV_RETURN_IF_ERROR(cache_->synchronize());
    return Packed{out_[0], out_[1], len, len * m_.head_dim};
  }
  Status rollback(uint64_t id, int64_t length) override { return cache_->rollback(id, length); }
  Status finish(uint64_t id) override { return cache_->finish(id); }

 private:
  explicit KvCacheApi(const Model& m) : m_(m), row_(static_cast<size_t>(m.heads) * m.head_dim) {}
  Model m_;
  size_t row_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Buffers> buffers_;  // freed before cache_ (declared after it)
  uint16_t* in_[2] = {};
  uint16_t* out_[2] = {};
  std::vector<SequenceId> one_{0};
  std::vector<TokenId> tokens_;
};

class SeedApi final : public Api {
 public:
  static StatusOr<std::unique_ptr<Api>> create(const Model& m, size_t input_elems) {
    auto api = std::unique_ptr<SeedApi>(new SeedApi(m));
    SeedKvCacheOptions options;
    options.enable_events = false;  // as for KvCache
    PAGEDKV_ASSIGN_OR_RETURN(api->cache_, SeedKvCache::create(make_config(m), options));
    for (auto& in : api->in_) in.resize(input_elems);
    return std::unique_ptr<Api>(std::move(api));
  }
  const char* name() const override { return "seed"; }
  uint16_t* input(int kv) override { return in_[kv].data(); }

  StatusOr<int64_t> add(uint64_t id, const std::vector<TokenId>& prompt) override {
    return cache_->allocate_sequence(id, prompt);
  }
  Status prefill(uint64_t id, const Seq& s, int64_t cached, const uint16_t* k,
                 const uint16_t* v) override {
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    const int64_t n = len - cached;
    for (int32_t l = 0; l < m_.layers; ++l) {
      for (int64_t p = cached; p < len; ++p) {
        const size_t at = (static_cast<size_t>(l) * n + (p - cached)) * row_;
        PAGEDKV_RETURN_IF_ERROR(cache_->append_token(id, l, p, HalfSpan(k + at, row_),
                                                     HalfSpan(v + at, row_),
                                                     s.tokens[static_cast<size_t>(p)]));
      }
    }
    PAGEDKV_RETURN_IF_ERROR(cache_->advance_sequence_by(id, n));
    return cache_->synchronize();
  }
  Status decode(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                const std::vector<int64_t>& positions, const uint16_t* k,
                const uint16_t* v) override {
    PAGEDKV_RETURN_IF_ERROR(cache_->set_active_sequences(ids));
    for (int32_t l = 0; l < m_.layers; ++l) {
      for (size_t i = 0; i < ids.size(); ++i) {
        const size_t at = (static_cast<size_t>(l) * ids.size() + i) * row_;
        PAGEDKV_RETURN_IF_ERROR(cache_->append_token(
            ids[i], l, positions[i], HalfSpan(k + at, row_), HalfSpan(v + at, row_), tokens[i]));
      }
    }
    for (SequenceId id : ids) PAGEDKV_RETURN_IF_ERROR(cache_->advance_sequence(id));
    return cache_->synchronize();
  }
  StatusOr<Packed> read(uint64_t id, int32_t layer) override {
    PAGEDKV_ASSIGN_OR_RETURN(const SeedKvView view, cache_->get_packed_layer(id, layer));
    PAGEDKV_RETURN_IF_ERROR(cache_->synchronize());
    return Packed{static_cast<const uint16_t*>(view.key), static_cast<const uint16_t*>(view.value),
                  view.length, view.head_stride};
  }
  Status rollback(uint64_t id, int64_t length) override {
    return cache_->rollback_sequence(id, length);
  }
  Status finish(uint64_t id) override { return cache_->remove_sequence(id); }

 private:
  explicit SeedApi(const Model& m) : m_(m), row_(static_cast<size_t>(m.heads) * m.head_dim) {}
  Model m_;
  size_t row_;
  std::unique_ptr<SeedKvCache> cache_;
  std::vector<uint16_t> in_[2];
};

struct Result {
  Timing timing;
  uint64_t checksum = kFnvStart;
  int64_t reads = 0, read_bytes = 0, written_bytes = 0, mismatches = 0;
  int64_t faults = 0;  // page faults in the timed part
};

// Replays `trace` through `api`; the first failed call ends it.
Status replay(const Trace& trace, Api& api, bool verify, Result* r) {
  const Model& m = trace.model;
  const size_t row = static_cast<size_t>(m.heads) * m.head_dim;
  std::unordered_map<uint64_t, Seq> seqs;
  std::vector<uint16_t> want(row);
  std::vector<int64_t> positions;
  std::vector<SequenceId> ids;
  Timing& t = r->timing;
  for (const Op& op : trace.ops) {
    switch (op.kind) {
      case OpKind::kTimed:
        t.on = true;
        r->faults = -page_faults();
        break;
      case OpKind::kAdmit: {
        const uint64_t id = op.ids[0];
        Seq& s = seqs[id];
        for (int32_t tok : op.tokens) s.push(tok);
        t.start();
        StatusOr<int64_t> cached = api.add(id, op.tokens);
        t.stop(op.kind);
        PAGEDKV_RETURN_IF_ERROR(cached.status());
        const int64_t len = static_cast<int64_t>(s.tokens.size());
        const int64_t n = len - *cached;
        for (int32_t l = 0; l < m.layers; ++l) {
          for (int64_t p = *cached; p < len; ++p) {
            const size_t at = (static_cast<size_t>(l) * n + (p - *cached)) * row;
            for (int kv = 0; kv < 2; ++kv) {
              fill_row(api.input(kv) + at, s.chain[static_cast<size_t>(p)], l, m.heads, m.head_dim,
                       static_cast<uint64_t>(kv));
            }
          }
        }
        t.start();
        const Status st = api.prefill(id, s, *cached, api.input(0), api.input(1));
        t.stop(op.kind);
        PAGEDKV_RETURN_IF_ERROR(st);
        if (t.on) r->written_bytes += 2 * m.layers * n * static_cast<int64_t>(row) * 2;
        break;
      }
      case OpKind::kDecode: {
        const size_t b = op.ids.size();
        ids.assign(op.ids.begin(), op.ids.end());
        positions.resize(b);
        for (size_t i = 0; i < b; ++i) {
          Seq& s = seqs.at(op.ids[i]);
          positions[i] = static_cast<int64_t>(s.tokens.size());
          s.push(op.tokens[i]);
        }
        for (int32_t l = 0; l < m.layers; ++l) {
          for (size_t i = 0; i < b; ++i) {
            const size_t at = (static_cast<size_t>(l) * b + i) * row;
            const uint64_t c = seqs.at(op.ids[i]).chain[static_cast<size_t>(positions[i])];
            for (int kv = 0; kv < 2; ++kv) {
              fill_row(api.input(kv) + at, c, l, m.heads, m.head_dim, static_cast<uint64_t>(kv));
            }
          }
        }
        t.start();
        const Status st = api.decode(ids, op.tokens, positions, api.input(0), api.input(1));
        t.stop(op.kind);
        PAGEDKV_RETURN_IF_ERROR(st);
        if (t.on) r->written_bytes += 2 * m.layers * static_cast<int64_t>(b * row) * 2;
        break;
      }
      case OpKind::kRead: {
        const uint64_t id = op.ids[0];
        const int32_t layer = static_cast<int32_t>(op.value);
        t.start();
        StatusOr<Packed> got = api.read(id, layer);
        t.stop(op.kind);
        PAGEDKV_RETURN_IF_ERROR(got.status());
        const Seq& s = seqs.at(id);
        const int64_t len = got->length;
        if (len != static_cast<int64_t>(s.tokens.size())) {
          return internal_error("sequence " + std::to_string(id) + ": read " + std::to_string(len) +
                                " positions, has " + std::to_string(s.tokens.size()));
        }
        uint64_t& acc = r->checksum;
        acc = fnv(fnv(fnv(acc, id), static_cast<uint64_t>(layer)), static_cast<uint64_t>(len));
        for (const uint16_t* data : {got->key, got->value}) {
          for (int32_t h = 0; h < m.heads; ++h) {
            acc =
                fnv_halves(acc, data + h * got->head_stride, static_cast<size_t>(len) * m.head_dim);
          }
        }
        for (int kv = 0; verify && kv < 2; ++kv) {
          const uint16_t* data = kv == 0 ? got->key : got->value;
          for (int64_t p = 0; p < len; ++p) {
            fill_row(want.data(), s.chain[static_cast<size_t>(p)], layer, m.heads, m.head_dim,
                     static_cast<uint64_t>(kv));
            for (int32_t h = 0; h < m.heads; ++h) {
              if (std::memcmp(data + h * got->head_stride + p * m.head_dim,
                              want.data() + h * m.head_dim, m.head_dim * 2) != 0) {
                ++r->mismatches;
              }
            }
          }
        }
        ++r->reads;
        r->read_bytes += 2 * m.heads * len * m.head_dim * 2;
        break;
      }
      case OpKind::kRollback: {
        t.start();
        const Status st = api.rollback(op.ids[0], op.value);
        t.stop(op.kind);
        PAGEDKV_RETURN_IF_ERROR(st);
        Seq& s = seqs.at(op.ids[0]);
        s.tokens.resize(static_cast<size_t>(op.value));
        s.chain.resize(static_cast<size_t>(op.value));
        break;
      }
      case OpKind::kFinish: {
        t.start();
        const Status st = api.finish(op.ids[0]);
        t.stop(op.kind);
        PAGEDKV_RETURN_IF_ERROR(st);
        seqs.erase(op.ids[0]);
        break;
      }
    }
  }
  r->faults += page_faults();
  return ok_status();
}

// The ceiling: a memcpy of `bytes` (what the timed part wrote and read) between two 32 MiB
// buffers, faulted in first, timed in the same run. Best of three.
double memcpy_ms(int64_t bytes) {
  constexpr size_t kChunk = size_t{32} << 20;
  std::vector<char> src(kChunk, 1), dst(kChunk, 0);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(kChunk)) {
      std::memcpy(dst.data(), src.data(), std::min<size_t>(kChunk, static_cast<size_t>(left)));
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    best = rep == 0 ? ms : std::min(best, ms);
  }
  if (dst[kChunk / 2] != 1) std::fprintf(stderr, "memcpy ceiling: copy lost\n");
  return best;
}

// The input rows an op needs at most: a whole prompt's or a decode step's, every layer.
size_t input_elems(const Trace& trace) {
  size_t rows = 0;
  for (const Op& op : trace.ops) {
    rows = std::max(rows, op.kind == OpKind::kAdmit ? op.tokens.size() : op.ids.size());
  }
  const Model& m = trace.model;
  return rows * m.layers * m.heads * m.head_dim;
}

int run(int argc, char** argv) {
  std::string generate, out_path, trace_path, api_name = "kvcache";
  bool verify = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--generate="))
      generate = v;
    else if (const char* v = value("--out="))
      out_path = v;
    else if (const char* v = value("--trace="))
      trace_path = v;
    else if (const char* v = value("--api="))
      api_name = v;
    else if (a == "--no-verify")
      verify = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (!generate.empty()) {
    Workload w;
    if (!find_workload(generate, &w) || out_path.empty()) {
      std::fprintf(stderr, "--generate=small|large needs --out=FILE\n");
      return 2;
    }
    std::ofstream out(out_path);
    write_trace(w, out);
    return out.good() ? 0 : 1;
  }
  Trace trace;
  std::string error;
  if (trace_path.empty() || !read_trace(trace_path, &trace, &error)) {
    std::fprintf(stderr, "%s\n", trace_path.empty() ? "--trace=FILE is needed" : error.c_str());
    return 2;
  }
  const Model& m = trace.model;
  const size_t in = input_elems(trace);
  // The longest sequence read: at most the pool.
  const size_t gather = static_cast<size_t>(m.blocks) * m.block_size * m.heads * m.head_dim;
  StatusOr<std::unique_ptr<Api>> api = api_name == "seed" ? SeedApi::create(m, in)
                                       : api_name == "kvcache"
                                           ? KvCacheApi::create(m, in, gather)
                                           : invalid_argument("--api=" + api_name);
  if (!api.ok()) {
    std::fprintf(stderr, "%s\n", api.status().to_string().c_str());
    return 1;
  }
  Result r;
  const Status st = replay(trace, **api, verify, &r);
  if (!st.ok()) {
    std::fprintf(stderr, "replay failed: %s\n", st.to_string().c_str());
    return 1;
  }
  double wall = 0;
  std::string kinds;
  for (int k = 0; k < kOpKinds; ++k) {
    wall += r.timing.wall_ms[k];
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %s_ms=%.1f", kOpNames[k], r.timing.wall_ms[k]);
    kinds += buf;
  }
  const double ceiling = memcpy_ms(r.read_bytes + r.written_bytes);
  std::printf(
      "replay impl=%s model=%s wall_ms=%.1f cpu_ms=%.1f%s memcpy_ms=%.1f vs_memcpy=%.2f "
      "reads=%lld read_mib=%.0f written_mib=%.0f faults=%lld checksum=0x%016llx\n",
      (*api)->name(), m.name.c_str(), wall, r.timing.cpu_ns / 1e6, kinds.c_str(), ceiling,
      ceiling / wall, static_cast<long long>(r.reads), r.read_bytes / 1048576.0,
      r.written_bytes / 1048576.0, static_cast<long long>(r.faults),
      static_cast<unsigned long long>(r.checksum));
  if (r.mismatches > 0) {
    std::fprintf(stderr, "%lld rows read back differ from what was written\n",
                 static_cast<long long>(r.mismatches));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pagedkv::bench::replay

int main(int argc, char** argv) { return pagedkv::bench::replay::run(argc, argv); }
