// libFuzzer target for the KvCache API. The input picks a tiny cache configuration, then a bounded
// sequence of API calls with fuzzed arguments, valid and invalid alike, and now and then arms a
// one-shot backend fault (FaultInjectionBackend) for one of the next calls. After every call:
//   * check_invariants() must pass;
//   * a call that failed on its own must have left observable state (stats, each tracked
//     sequence's existence, length, pending count and block locations) exactly as it was
//     (every call either succeeds or changes nothing) and must not be kInternal;
//   * a call that failed because of the injected fault must return it (kInternal, "injected
//     fault"); a plain call must have changed nothing, a tier-moving one (reserve, offload,
//     restore, prefetch) is taken back except for evictions and dropped victims
//     (fuzz_snapshot.hpp, diff_taken_back);
//   * sequences reported evicted leave the reference model.
// The reference model is each live sequence's committed token list (tests/runtime/kv_model.hpp):
// K/V bytes are a pure function of (position, token, layer, part, head, dim), so a "verify"
// opcode gathers a device-resident sequence and compares every element.
//
// Any violation aborts with a message, so libFuzzer records the input as a crash.
// PAGEDKV_FUZZ_TRACE=1 prints every decoded call and its status (docs/fuzzing.md).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_snapshot.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/fault_injection.hpp"
#include "runtime/kv_model.hpp"

namespace pagedkv {
namespace {

using fuzz::id_name;
using fuzz::Snapshot;

constexpr int kMaxCalls = 64;
constexpr int32_t kMaxSeqLen = 40;
constexpr int kMaxTrackedIds = 10;  // ids 1..9 are the fuzzer's names, plus 0 (and UINT64_MAX)
// Opcode bytes: below kPrefetchOp, byte % 16 picks one of the original 16 calls; the two ranges
// above were added later (corpus inputs with such bytes changed meaning).
constexpr uint8_t kPrefetchOp = 224;  // 224-239
constexpr uint8_t kFaultOp = 240;     // 240-255

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "kv_cache_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

bool tracing() {
  static const bool on = [] {
    const char* e = std::getenv("PAGEDKV_FUZZ_TRACE");
    return e != nullptr && *e != '\0' && *e != '0';
  }();
  return on;
}

// The process-wide backends: a CPU backend, and the fault injector wrapped around it that the
// caches use. One for the whole process: the CPU backend's worker threads would otherwise be
// created and joined for every input, which dominated the cost of a small input. The harness's
// own buffers (and their memsets) go to the inner backend, so only the cache's calls are
// counted and failed.
struct Backends {
  Backend* inner;
  FaultInjectionBackend* faults;
};

Backends& backends() {
  static Backends b = [] {
    Backend* inner = create_cpu_backend().release();
    return Backends{inner, new FaultInjectionBackend(*inner)};
  }();
  return b;
}

// Reads the input front to back; past the end every read is 0, so every input is a valid program.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// One tracked sequence of the reference model.
struct ModelSeq {
  std::vector<TokenId> tokens;   // committed
  std::vector<TokenId> planned;  // token ids of the reserved, uncommitted slots
  uint32_t written_layers = 0;   // layers whose K/V of `planned` were written
};

std::string ids_string(const std::vector<SequenceId>& ids) {
  std::string out = "{";
  for (size_t i = 0; i < ids.size(); ++i) out += (i == 0 ? "" : ", ") + id_name(ids[i]);
  return out + "}";
}

class Harness {
 public:
  explicit Harness(Reader& in) : in_(in) {}

  void run() {
    if (!create()) return;
    for (int call = 0; call < kMaxCalls && !in_.done(); ++call) {
      call_ = call;
      step();
    }
    // The injector is process-wide: what this input armed must not fire in the next one (or in
    // this cache's destructor).
    faults_->disarm_all();
    call_ = -1;
    // Every surviving, trustworthy sequence must still read back as the model says.
    for (auto& [id, m] : model_) verify(id, /*layout_major=*/0);
  }

 private:
  bool create() {
    const uint8_t a = in_.u8(), b = in_.u8(), c = in_.u8(), d = in_.u8();
    static constexpr int32_t kHeadDims[] = {8, 16, 64, 80};
    config_.num_layers = 1 + a % 3;
    config_.num_kv_heads = 1 + (a / 3) % 3;
    config_.head_dim = kHeadDims[(a / 9) % 4];
    // a % 36 fixes the shape; a / 36 was spare. Odd: cached prefix blocks evicted from the
    // device are dropped instead of demoted to the host tier.
    config_.cache_prefixes_on_host = (a / 36) % 2 == 0;
    config_.block_size = 1 + b % 8;
    config_.num_device_blocks = 2 + (b / 8) % 23;
    config_.num_host_blocks = c % 17;
    config_.dtype = static_cast<DType>((c / 17) % kNumDTypes);
    config_.page_layout = (d & 1) ? PageLayout::kHND : PageLayout::kNHD;
    config_.eviction_policy = static_cast<EvictionPolicy>((d >> 1) % 3);
    config_.enable_prefix_caching = (d & 8) == 0;
    config_.max_sequence_length = kMaxSeqLen;
    config_.backend = BackendKind::kCpu;
    inner_ = backends().inner;
    faults_ = backends().faults;
    faults_->reset_counts();  // disarms too
    KvCacheOptions o;
    o.backend = faults_;
    o.clock = [this] { return now_ns_; };
    auto cache = KvCache::create(config_, o);
    if (!cache.ok()) fail("create: " + cache.status().to_string());
    cache_ = std::move(cache).value();
    if (tracing()) {
      std::fprintf(stderr,
                   "config: layers %d, kv_heads %d, head_dim %d, block_size %d, device blocks "
                   "%lld, host blocks %lld, dtype %s, %s, eviction %s, prefix caching %s, "
                   "prefixes on host %s\n",
                   config_.num_layers, config_.num_kv_heads, config_.head_dim, config_.block_size,
                   static_cast<long long>(config_.num_device_blocks),
                   static_cast<long long>(config_.num_host_blocks), dtype_name(config_.dtype),
                   page_layout_name(config_.page_layout),
                   eviction_policy_name(config_.eviction_policy),
                   config_.enable_prefix_caching ? "on" : "off",
                   config_.cache_prefixes_on_host ? "on" : "off");
    }
    row_ = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
    // Inputs: room for kMaxSeqLen rows of fp32 with a row stride of up to two rows.
    const size_t bytes = static_cast<size_t>(kMaxSeqLen * row_ * 2 * 4 + 64);
    in_k_ = alloc(bytes);
    in_v_ = alloc(bytes);
    out_k_ = alloc(bytes);
    out_v_ = alloc(bytes);
    return true;
  }

  void* alloc(size_t bytes) {
    auto p = inner_->allocate_device(bytes);
    if (!p.ok()) fail("allocate_device: " + p.status().to_string());
    buffers_.emplace_back(*p, [be = inner_](void* q) { be->free_device(q); });
    return *p;
  }

  // A sequence id: mostly a live one, sometimes any id (unknown, erased, 0, huge).
  SequenceId pick_id() {
    const uint8_t b = in_.u8();
    if (b < 160 && !model_.empty()) {
      auto it = model_.begin();
      std::advance(it, static_cast<long>(b % model_.size()));
      return it->first;
    }
    if (b == 255) return ~SequenceId{0};
    return b % kMaxTrackedIds;
  }

  // A count: mostly small, sometimes negative, zero, past the limit or huge.
  int64_t pick_count() {
    const uint8_t b = in_.u8();
    if (b < 200) return b % 9;
    switch (b % 5) {
      case 0:
        return -1;
      case 1:
        return kMaxSeqLen + 1;
      case 2:
        return INT64_MAX;
      case 3:
        return INT64_MIN;
      default:
        return 16 + b % 24;
    }
  }

  TokenId pick_token() { return static_cast<TokenId>(in_.u8() % 6); }

  Snapshot snapshot() const { return fuzz::take_snapshot(*cache_, faults_->injected()); }

  // Names the call about to be made, for PAGEDKV_FUZZ_TRACE and failure messages.
  template <typename... Args>
  void note(const char* format, Args... args) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), format, args...);
    what_ = buf;
  }

  std::string where(const char* name) const {
    return "call " + std::to_string(call_) + " " + name + (what_.empty() ? "" : " " + what_);
  }

  // An injected fault must come back as itself: kInternal "injected fault: ...". A cache that
  // could not take the call back says "the cache is unusable" (also kInternal, quoting the
  // fault): with one one-shot fault that repair cannot fail, so that is a bug too.
  void check_injected_status(const char* name, const Status& st) {
    if (st.code() != StatusCode::kInternal ||
        st.message().find("injected fault") == std::string::npos ||
        st.message().find("unusable") != std::string::npos) {
      fail(where(name) + ": the injected fault \"" + faults_->last_fault() + "\" came back as " +
           st.to_string());
    }
  }

  // Checks the rules that hold after any call; `st` is the call's status, `before` the state
  // just before it. A tier-moving call (reserve, offload, restore, prefetch) that an injected
  // fault made fail is held to diff_taken_back, any other failed call to diff. Returns true
  // when the call failed because of an injected fault (the caller may retry it).
  bool after(const char* name, const Status& st, const Snapshot& before, bool moves_tiers = false) {
    const bool fired = faults_->injected() != before.injected;
    if (tracing()) {
      // The call, its status and everything it changed.
      std::fprintf(stderr, "[%d] %s %s -> %s%s\n     changed:%s\n", call_, name, what_.c_str(),
                   st.to_string().c_str(), fired && st.ok() ? " (fault absorbed)" : "",
                   fuzz::diff(before, snapshot()).c_str());
    }
    const Status inv = cache_->check_invariants();
    if (!inv.ok()) {
      fail(where(name) + " (" + st.to_string() + ") broke an invariant: " + inv.to_string());
    }
    const std::vector<SequenceId> dropped = cache_->drain_evicted_sequences();
    const bool injected = !st.ok() && fired;
    if (!st.ok()) {
      if (injected) check_injected_status(name, st);
      if (st.code() == StatusCode::kInternal && !injected) {
        fail(where(name) + ": kInternal without an injected fault: " + st.to_string());
      }
      const Snapshot now = snapshot();
      const std::string d = injected && moves_tiers ? fuzz::diff_taken_back(before, now, dropped)
                                                    : fuzz::diff(before, now);
      if (!d.empty()) {
        fail(where(name) + " failed (" + st.to_string() + ") but changed:" + d);
      }
    }
    for (SequenceId id : dropped) {
      if (model_.erase(id) != 1) fail(where(name) + ": evicted unknown sequence " + id_name(id));
    }
    // Keep the model's view of each sequence in step with the cache.
    for (auto it = model_.begin(); it != model_.end();) {
      if (!cache_->contains(it->first)) {
        fail(where(name) + ": sequence vanished: " + id_name(it->first));
      }
      ModelSeq& m = it->second;
      const int64_t len = cache_->length(it->first).value();
      const int64_t pend = cache_->pending(it->first).value();
      if (len != static_cast<int64_t>(m.tokens.size())) {
        fail(where(name) + ": sequence " + id_name(it->first) + " length " + std::to_string(len) +
             ", model " + std::to_string(m.tokens.size()));
      }
      if (pend != static_cast<int64_t>(m.planned.size())) {
        fail(where(name) + ": sequence " + id_name(it->first) + " pending " + std::to_string(pend) +
             ", model " + std::to_string(m.planned.size()));
      }
      ++it;
    }
    what_.clear();
    return injected;
  }

  // One of the harness's own cache calls (synchronize, verify's gather): an injected fault is
  // retried once; it is one-shot and nothing else is armed, so the retry must succeed.
  Status own_call(const char* name, const std::function<Status()>& f) {
    const int64_t injected = faults_->injected();
    Status s = f();
    if (!s.ok() && faults_->injected() != injected) {
      check_injected_status(name, s);
      if (tracing()) std::fprintf(stderr, "    %s: %s, retried\n", name, s.to_string().c_str());
      s = f();
    }
    return s;
  }

  void sync() {
    const Status s = own_call("synchronize", [this] { return cache_->synchronize(); });
    if (!s.ok()) fail("synchronize: " + s.to_string());
  }

  void step() {
    const uint8_t byte = in_.u8();
    const Snapshot before = snapshot();
    if (byte >= kFaultOp) return arm_fault();
    if (byte >= kPrefetchOp) return prefetch(before);
    const uint8_t op = byte % 16;
    switch (op) {
      case 0:
        add(before);
        break;
      case 1:
        reserve(before);
        break;
      case 2:
        write(before);
        break;
      case 3:
        commit(before);
        break;
      case 4:
        rollback(before);
        break;
      case 5:
        fork(before);
        break;
      case 6:
      case 7:
        remove(before, op == 6);
        break;
      case 8:
        set_active(before);
        break;
      case 9:
        set_priority(before);
        break;
      case 10:
        offload(before);
        break;
      case 11:
        restore(before);
        break;
      case 12: {
        const SequenceId id = pick_id();
        verify(id, in_.u8());
        break;
      }
      case 13:
        bad_gather(before);
        break;
      case 14:
        build_batch(before);
        break;
      default:
        extend(before);
        break;
    }
  }

  // Arms one backend fault, replacing any armed one (one at a time: a second fault could hit
  // the repair of the first, which the cache reports as unusable by design): the n-th call of
  // that kind from now fails, once.
  void arm_fault() {
    const uint8_t k = in_.u8();
    const FaultKind kind = static_cast<FaultKind>(k % kNumFaultKinds);
    const int64_t n = 1 + (k / kNumFaultKinds) % 4;
    faults_->disarm_all();
    faults_->fail_nth(kind, n);
    if (tracing()) {
      std::fprintf(stderr, "[%d] arm fault: %s call #%lld from now\n", call_, fault_kind_name(kind),
                   static_cast<long long>(n));
    }
  }

  void add(const Snapshot& before) {
    const SequenceId id = pick_id();
    const uint8_t shape = in_.u8();
    std::vector<TokenId> prompt;
    // A shared system prompt makes prefix hits likely; the tail makes prompts differ.
    for (int i = 0; i < (shape & 7) * 2; ++i) prompt.push_back(static_cast<TokenId>(i % 5));
    const int tail = (shape >> 3) % 6;
    for (int i = 0; i < tail; ++i) prompt.push_back(pick_token());
    if (shape == 255) prompt.assign(kMaxSeqLen + 3, 1);  // longer than any sequence may be
    SequenceOptions opts;
    const uint8_t o = in_.u8();
    opts.priority = static_cast<int32_t>(o % 4) - 1;
    opts.ns = (o >> 2) % 2;
    opts.retention_priority = (o & 0x80) ? 120 : static_cast<int32_t>(o % 101);
    opts.retention_duration_ns = (o & 0x40) ? 1000 : 0;
    if (tracing()) {
      std::string p;
      for (TokenId t : prompt) p += std::to_string(t);
      note("(%s, prompt[%zu] %s, priority %d, ns %llu, retention %d/%lld)", id_name(id).c_str(),
           prompt.size(), p.c_str(), opts.priority, static_cast<unsigned long long>(opts.ns),
           opts.retention_priority, static_cast<long long>(opts.retention_duration_ns));
    }
    auto r = cache_->add_sequence(id, prompt, opts);
    if (r.ok()) {
      if (*r < 0 || *r > static_cast<int64_t>(prompt.size())) fail("add_sequence: bad hit length");
      if (tracing()) note("%s = %lld cached", what_.c_str(), static_cast<long long>(*r));
      ModelSeq m;
      m.tokens.assign(prompt.begin(), prompt.begin() + *r);
      // Bytes of a prefix hit are only as good as what the cached blocks were written with.
      model_[id] = std::move(m);
    }
    after("add_sequence", r.status(), before);
  }

  void reserve(const Snapshot& before) {
    const SequenceId id = pick_id();
    const int64_t n = pick_count();
    note("(%s, %lld)", id_name(id).c_str(), static_cast<long long>(n));
    auto r = cache_->reserve(id, n);
    if (r.ok()) {
      if (static_cast<int64_t>(r->size()) != n) fail("reserve: slot count differs from n");
      ModelSeq& m = model_.at(id);
      m.planned.clear();
      for (int64_t i = 0; i < n; ++i) m.planned.push_back(pick_token());
      m.written_layers = 0;
    }
    after("reserve", r.status(), before, /*moves_tiers=*/true);
  }

  // Fills the input buffers with the model's rows of `m.planned` for one layer, in `dtype`
  // with `stride` elements between rows.
  void fill_inputs(const ModelSeq& m, int32_t layer, DType dtype, int64_t stride) {
    // Kernels read inputs asynchronously: earlier ones must be done before we overwrite them.
    sync();
    const int64_t start = static_cast<int64_t>(m.tokens.size());
    for (int part = 0; part < 2; ++part) {
      const std::vector<uint16_t> rows =
          testing::model_rows(config_, layer, part, m.planned, start);
      void* dst = part == 0 ? in_k_ : in_v_;
      for (size_t t = 0; t < m.planned.size(); ++t)
        for (int64_t e = 0; e < row_; ++e)
          store_from_float(dst, dtype, static_cast<int64_t>(t) * stride + e,
                           half_bits_to_float(rows[t * static_cast<size_t>(row_) + e]));
    }
  }

  void write(const Snapshot& step_before) {
    const SequenceId id = pick_id();
    const uint8_t a = in_.u8();
    int32_t layer = a % 4;  // 3 is out of range for every config with fewer layers
    if (a & 0x80) layer = (a & 0x40) ? -1 : INT32_MAX;
    const uint8_t b = in_.u8();
    static constexpr DType kInputs[] = {DType::kFloat16, DType::kFloat32, DType::kBFloat16,
                                        static_cast<DType>(9)};
    const DType dtype = kInputs[b % 4];
    const int64_t strides[] = {0, row_, row_ + 8, row_ - 1, -row_};
    const int64_t stride = strides[(b >> 2) % 5];
    const bool null_key = (b >> 5) % 8 == 1, null_value = (b >> 5) % 8 == 2;
    const bool misaligned = (b >> 5) % 8 == 3;
    auto mit = model_.find(id);
    if (mit != model_.end() && (dtype == DType::kFloat16 || dtype == DType::kFloat32) &&
        stride >= 0) {
      fill_inputs(mit->second, layer >= 0 && layer < 4 ? layer : 0, dtype,
                  stride == 0 ? row_ : stride);
    }
    // fill_inputs' synchronize may have used up an armed fault: count from here.
    Snapshot before = step_before;
    before.injected = faults_->injected();
    const void* k = null_key ? nullptr : static_cast<char*>(in_k_) + (misaligned ? 1 : 0);
    const void* v = null_value ? nullptr : in_v_;
    note("(%s, layer %d, dtype %d, stride %lld%s%s%s)", id_name(id).c_str(), layer,
         static_cast<int>(dtype), static_cast<long long>(stride), null_key ? ", null key" : "",
         null_value ? ", null value" : "", misaligned ? ", misaligned key" : "");
    const Status s = cache_->write_kv(id, layer, k, v, dtype, stride);
    if (s.ok() && mit != model_.end()) {
      ModelSeq& m = mit->second;
      if (stride < 0 || (stride > 0 && stride < row_)) fail("write_kv accepted a bad row_stride");
      if (dtype == DType::kFloat16 || dtype == DType::kFloat32) {
        m.written_layers |= 1u << layer;
      } else {
        trusted_ = false;  // bf16 inputs: the bytes no longer follow the fp16 model
      }
    }
    after("write_kv", s, before);
  }

  void commit(const Snapshot& before) {
    const SequenceId id = pick_id();
    const int64_t n = pick_count();
    const uint8_t wrong = in_.u8();
    auto mit = model_.find(id);
    std::vector<TokenId> tokens;
    if (n >= 0 && n <= kMaxSeqLen + 1) {
      for (int64_t i = 0; i < n; ++i) {
        const bool have =
            mit != model_.end() && i < static_cast<int64_t>(mit->second.planned.size());
        tokens.push_back(have ? mit->second.planned[static_cast<size_t>(i)] : 0);
      }
      if (wrong == 7 && !tokens.empty()) tokens[0] += 1;  // ids that differ from what was written
    }
    note("(%s, %zu tokens%s)", id_name(id).c_str(), tokens.size(),
         wrong == 7 && !tokens.empty() ? ", first one wrong" : "");
    const Status s = cache_->commit(id, tokens);
    if (s.ok() && mit != model_.end()) {
      ModelSeq& m = mit->second;
      const uint32_t all = (1u << config_.num_layers) - 1;
      if (!tokens.empty() && (m.written_layers != all || wrong == 7)) trusted_ = false;
      if (tokens.size() > m.planned.size()) fail("commit accepted more than reserved");
      m.tokens.insert(m.tokens.end(), tokens.begin(), tokens.end());
      m.planned.erase(m.planned.begin(), m.planned.begin() + static_cast<long>(tokens.size()));
    }
    after("commit", s, before);
  }

  void rollback(const Snapshot& before) {
    const SequenceId id = pick_id();
    const int64_t len = pick_count();
    note("(%s, %lld)", id_name(id).c_str(), static_cast<long long>(len));
    const Status s = cache_->rollback(id, len);
    if (s.ok()) {
      ModelSeq& m = model_.at(id);
      if (len < 0 || len > static_cast<int64_t>(m.tokens.size()))
        fail("rollback accepted " + std::to_string(len));
      m.tokens.resize(static_cast<size_t>(len));
      m.planned.clear();
      m.written_layers = 0;
    }
    after("rollback", s, before);
  }

  void fork(const Snapshot& before) {
    const SequenceId parent = pick_id();
    const SequenceId child = pick_id();
    note("(%s -> %s)", id_name(parent).c_str(), id_name(child).c_str());
    const Status s = cache_->fork(parent, child);
    if (s.ok()) {
      ModelSeq m;
      m.tokens = model_.at(parent).tokens;
      model_[child] = std::move(m);
    }
    after("fork", s, before);
  }

  void remove(const Snapshot& before, bool finish) {
    const SequenceId id = pick_id();
    note("(%s)", id_name(id).c_str());
    const Status s = finish ? cache_->finish(id) : cache_->erase(id);
    if (s.ok()) model_.erase(id);
    after(finish ? "finish" : "erase", s, before);
  }

  std::vector<SequenceId> pick_ids() {
    const uint8_t n = in_.u8() % 4;
    std::vector<SequenceId> ids;
    for (int i = 0; i < n; ++i) ids.push_back(pick_id());
    return ids;
  }

  void set_active(const Snapshot& before) {
    const std::vector<SequenceId> ids = pick_ids();
    note("(%s)", ids_string(ids).c_str());
    after("set_active", cache_->set_active(ids), before);
  }

  void set_priority(const Snapshot& before) {
    const SequenceId id = pick_id();
    const uint8_t p = in_.u8();
    const int32_t priority = p == 255 ? INT32_MIN : p % 5 - 2;
    now_ns_ += 600;  // let retention deadlines pass now and then
    note("(%s, %d)", id_name(id).c_str(), priority);
    after("set_priority", cache_->set_priority(id, priority), before);
  }

  void offload(const Snapshot& before) {
    const SequenceId id = pick_id();
    note("(%s)", id_name(id).c_str());
    after("offload", cache_->offload(id), before, /*moves_tiers=*/true);
  }

  void restore(const Snapshot& before) {
    const SequenceId id = pick_id();
    note("(%s)", id_name(id).c_str());
    after("restore", cache_->restore(id), before, /*moves_tiers=*/true);
  }

  // prefetch(ids): restores, in order, each offloaded sequence whose host blocks fit into the
  // free and evictable device blocks (KvCache::prefetch), never offloading or dropping anyone.
  void prefetch(const Snapshot& before) {
    const std::vector<SequenceId> ids = pick_ids();
    note("(%s)", ids_string(ids).c_str());
    const Status s = cache_->prefetch(ids);
    if (s.ok()) {
      const std::string wrong = fuzz::check_prefetch(ids, before, snapshot());
      if (!wrong.empty()) fail(where("prefetch") + ":" + wrong);
    }
    after("prefetch", s, before, /*moves_tiers=*/true);
  }

  void build_batch(const Snapshot& before) {
    const std::vector<SequenceId> ids = pick_ids();
    BatchOptions o;
    const uint8_t b = in_.u8();
    o.build_csr = b & 1;
    o.pad_slots_to = (b & 2) ? (b >> 2) % 20 : 0;
    if (b == 255) o.pad_slots_to = -1;
    note("(%s, csr %d, pad %lld)", ids_string(ids).c_str(), static_cast<int>(o.build_csr),
         static_cast<long long>(o.pad_slots_to));
    auto r = cache_->build_batch(ids, o);
    after("build_batch", r.status(), before);
  }

  // Reserve, write every layer and commit in one opcode, so short inputs reach deep states.
  void extend(const Snapshot& before) {
    const SequenceId id = pick_id();
    const int64_t n = 1 + in_.u8() % 8;
    note("(%s, %lld): reserve", id_name(id).c_str(), static_cast<long long>(n));
    auto r = cache_->reserve(id, n);
    if (!r.ok()) {
      after("extend", r.status(), before, /*moves_tiers=*/true);
      return;
    }
    ModelSeq& m = model_.at(id);
    m.planned.clear();
    for (int64_t i = 0; i < n; ++i) m.planned.push_back(pick_token());
    m.written_layers = 0;
    after("extend", r.status(), before, /*moves_tiers=*/true);
    if (model_.count(id) == 0) return;  // cannot happen: a reserve never drops its own sequence
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      fill_inputs(model_.at(id), l, DType::kFloat16, row_);
      Status s;
      // An injected fault fails the write and changes nothing; it is one-shot: retry once.
      for (int attempt = 0; attempt < 2; ++attempt) {
        const Snapshot b = snapshot();
        note("(%s): write_kv layer %d", id_name(id).c_str(), l);
        s = cache_->write_kv(id, l, in_k_, in_v_, DType::kFloat16, 0);
        if (!after("extend", s, b)) break;
      }
      if (!s.ok()) fail(where("extend") + ": write_kv: " + s.to_string());
      model_.at(id).written_layers |= 1u << l;
    }
    const Snapshot b = snapshot();
    ModelSeq& m2 = model_.at(id);
    const std::vector<TokenId> tokens = m2.planned;
    note("(%s): commit", id_name(id).c_str());
    const Status s = cache_->commit(id, tokens);
    if (s.ok()) {
      m2.tokens.insert(m2.tokens.end(), tokens.begin(), tokens.end());
      m2.planned.clear();
    }
    after("extend", s, b);
  }

  void bad_gather(const Snapshot& before) {
    const SequenceId id = pick_id();
    const uint8_t a = in_.u8(), b = in_.u8();
    int32_t layer = a % 4;
    if (a & 0x80) layer = (a & 0x40) ? -1 : INT32_MAX;
    static constexpr int64_t kPos[] = {0, 1, -1, INT64_MAX, INT64_MIN, 3, kMaxSeqLen, 2};
    const int64_t begin = kPos[b % 8];
    const int64_t num = kPos[(b >> 3) % 8];
    const DType dtype = (b & 0x40) ? static_cast<DType>(7) : DType::kFloat32;
    const PackedLayout layout =
        (b & 0x80) ? static_cast<PackedLayout>(5) : PackedLayout::kHeadMajor;
    void* k = (a & 0x20) ? nullptr : out_k_;
    void* v = (a & 0x10) ? nullptr : out_v_;
    note("(%s, layer %d, begin %lld, num %lld, dtype %d, layout %d%s%s)", id_name(id).c_str(),
         layer, static_cast<long long>(begin), static_cast<long long>(num), static_cast<int>(dtype),
         static_cast<int>(layout), k == nullptr ? ", null key" : "",
         v == nullptr ? ", null value" : "");
    const Status s = cache_->gather_layer(id, layer, k, v, dtype, layout, begin, num);
    after("gather_layer", s, before);
  }

  // Gathers every layer of a device-resident sequence and compares it with the model.
  void verify(SequenceId id, uint8_t how) {
    auto mit = model_.find(id);
    if (tracing()) std::fprintf(stderr, "[%d] verify %s\n", call_, id_name(id).c_str());
    if (mit == model_.end() || !trusted_) return;
    auto blocks = cache_->block_locations(id);
    if (!blocks.ok()) fail("block_locations of a live sequence: " + blocks.status().to_string());
    for (const BlockLocation& l : *blocks)
      if (l.tier != Tier::kDevice) return;  // offloaded: not readable until restored
    const std::vector<TokenId>& tokens = mit->second.tokens;
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return;
    const PackedLayout layout = (how & 1) ? PackedLayout::kTokenMajor : PackedLayout::kHeadMajor;
    const int32_t H = config_.num_kv_heads, D = config_.head_dim;
    for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
      std::memset(out_k_, 0xff, static_cast<size_t>(n * row_ * 4));  // poison
      std::memset(out_v_, 0xff, static_cast<size_t>(n * row_ * 4));
      const Status s = own_call("verify.gather_layer", [&] {
        return cache_->gather_layer(id, layer, out_k_, out_v_, DType::kFloat32, layout, 0, -1);
      });
      if (!s.ok()) fail("verify: gather_layer: " + s.to_string());
      sync();
      for (int64_t t = 0; t < n; ++t)
        for (int32_t h = 0; h < H; ++h)
          for (int32_t d = 0; d < D; ++d) {
            const int64_t i = layout == PackedLayout::kTokenMajor
                                  ? (t * H + h) * D + d
                                  : (static_cast<int64_t>(h) * n + t) * D + d;
            for (int part = 0; part < 2; ++part) {
              // The pool stores the fp16 model value in its own dtype; fp32 reads it back exactly.
              unsigned char cell[4];
              store_from_float(cell, config_.dtype, 0,
                               half_bits_to_float(testing::kv_value(
                                   t, tokens[static_cast<size_t>(t)], layer, part, h, d)));
              const float want = load_as_float(cell, config_.dtype, 0);
              const float got = static_cast<const float*>(part == 0 ? out_k_ : out_v_)[i];
              if (std::memcmp(&want, &got, 4) != 0) {
                fail("verify (call " + std::to_string(call_) + "): sequence " + id_name(id) +
                     " layer " + std::to_string(layer) + " part " + std::to_string(part) + " pos " +
                     std::to_string(t) + " head " + std::to_string(h) + " dim " +
                     std::to_string(d) + ": got " + std::to_string(got) + ", model " +
                     std::to_string(want));
              }
            }
          }
    }
  }

  Reader& in_;
  CacheConfig config_;
  Backend* inner_ = nullptr;                 // process-wide, see backends()
  FaultInjectionBackend* faults_ = nullptr;  // process-wide, wraps inner_; the cache's backend
  std::vector<std::unique_ptr<void, std::function<void(void*)>>> buffers_;
  std::unique_ptr<KvCache> cache_;  // declared after the buffers: destroyed first
  void* in_k_ = nullptr;
  void* in_v_ = nullptr;
  void* out_k_ = nullptr;
  void* out_v_ = nullptr;
  int64_t row_ = 0;
  int64_t now_ns_ = 0;
  int call_ = 0;
  std::string what_;     // the call being made, with its arguments (note())
  bool trusted_ = true;  // false once bytes were written that the model cannot describe
  std::map<SequenceId, ModelSeq> model_;
};

}  // namespace
}  // namespace pagedkv

// The cache logs each pool allocation at info level: one line per input would drown the fuzzer's
// own output and cost throughput.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  setenv("PAGEDKV_LOG_LEVEL", "warn", /*overwrite=*/0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pagedkv::Reader in(data, size);
  pagedkv::Harness h(in);
  h.run();
  return 0;
}
