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
//   * sequences reported evicted leave the reference model;
//   * a DeviceBatch that a later successful call made stale is refused by write_kv_batch
//     (kFailedPrecondition, nothing changed); the current one is not.
// The reference model is each live sequence's committed token list (tests/runtime/kv_model.hpp):
// K/V bytes are a pure function of (position, token, layer, part, head, dim), so a "verify"
// opcode gathers a device-resident sequence and compares every element. Batched writes put the
// model's bytes of each batch row's (position, token).
//
// Any violation aborts with a message, so libFuzzer records the input as a crash.
// PAGEDKV_FUZZ_TRACE=1 prints every decoded call and its status (docs/fuzzing.md).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fuzz_harness.hpp"
#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/dtype.hpp"
#include "runtime/kv_model.hpp"

namespace pagedkv::fuzz {

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

Backends& backends() {
  static Backends b = [] {
    Backend* inner = create_cpu_backend().release();
    return Backends{inner, new FaultInjectionBackend(*inner)};
  }();
  return b;
}

std::string ids_string(const std::vector<SequenceId>& ids) {
  std::string out = "{";
  for (size_t i = 0; i < ids.size(); ++i) out += (i == 0 ? "" : ", ") + id_name(ids[i]);
  return out + "}";
}

void Harness::run() {
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
  if (tracing() && store_ != nullptr) {
    const ControlStats st = cache_->stats();
    std::fprintf(stderr, "storage: %lld blocks written, %lld hit, %lld host drops\n",
                 static_cast<long long>(st.storage_blocks_written),
                 static_cast<long long>(st.storage_hit_blocks),
                 static_cast<long long>(st.host_blocks_dropped));
  }
}

bool Harness::create() {
  const uint8_t a = in_.u8(), b = in_.u8(), c = in_.u8(), d = in_.u8();
  static constexpr int32_t kHeadDims[] = {8, 16, 64, 80};
  config_.num_layers = 1 + a % 3;
  config_.num_kv_heads = 1 + (a / 3) % 3;
  config_.head_dim = kHeadDims[(a / 9) % 4];
  // a % 36 fixes the shape; a / 36 was spare. Odd: cached prefix blocks evicted from the
  // device are dropped instead of demoted to the host tier.
  config_.cache_prefixes_on_host = (a / 36) % 2 == 0;
  // a / 72 (spare until then): a small control-event ring, so that drain_events sees overflow.
  static const size_t kEventCapacities[] = {KvCacheOptions{}.event_capacity, 1, 2, 8};
  event_capacity_ = kEventCapacities[a / 72];
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
  o.event_capacity = event_capacity_;
  // c / 68 (spare until then): a storage tier behind the host tier, when there is one.
  if ((c / 68) % 2 == 1 && config_.num_host_blocks > 0) {
    store_ = std::make_unique<MemoryStore>(StorageLayout::from_config(config_, "fuzz"));
    o.storage = store_.get();
  }
  auto cache = KvCache::create(config_, o);
  if (!cache.ok()) fail("create: " + cache.status().to_string());
  cache_ = std::move(cache).value();
  if (tracing()) {
    std::fprintf(
        stderr,
        "config: layers %d, kv_heads %d, head_dim %d, block_size %d, device blocks "
        "%lld, host blocks %lld, dtype %s, %s, eviction %s, prefix caching %s, "
        "prefixes on host %s, event capacity %zu, storage %s\n",
        config_.num_layers, config_.num_kv_heads, config_.head_dim, config_.block_size,
        static_cast<long long>(config_.num_device_blocks),
        static_cast<long long>(config_.num_host_blocks), dtype_name(config_.dtype),
        page_layout_name(config_.page_layout), eviction_policy_name(config_.eviction_policy),
        config_.enable_prefix_caching ? "on" : "off", config_.cache_prefixes_on_host ? "on" : "off",
        event_capacity_, store_ != nullptr ? "memory" : "none");
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

void* Harness::alloc(size_t bytes) {
  auto p = inner_->allocate_device(bytes);
  if (!p.ok()) fail("allocate_device: " + p.status().to_string());
  buffers_.emplace_back(*p, [be = inner_](void* q) { be->free_device(q); });
  return *p;
}

// A sequence id: mostly a live one, sometimes any id (unknown, erased, 0, huge).
SequenceId Harness::pick_id() {
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
int64_t Harness::pick_count() {
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

std::vector<SequenceId> Harness::pick_ids() {
  const uint8_t n = in_.u8() % 4;
  std::vector<SequenceId> ids;
  for (int i = 0; i < n; ++i) ids.push_back(pick_id());
  return ids;
}

// How write_kv hands its input over: input dtype fp16/fp32/bf16/unknown, row stride
// 0/row/row+8/row-1/-row, a null key or value, a misaligned key.
WriteHow Harness::pick_write_how() {
  const uint8_t b = in_.u8();
  static constexpr DType kInputs[] = {DType::kFloat16, DType::kFloat32, DType::kBFloat16,
                                      static_cast<DType>(9)};
  WriteHow how;
  how.dtype = kInputs[b % 4];
  const int64_t strides[] = {0, row_, row_ + 8, row_ - 1, -row_};
  how.stride = strides[(b >> 2) % 5];
  how.null_key = (b >> 5) % 8 == 1;
  how.null_value = (b >> 5) % 8 == 2;
  how.misaligned = (b >> 5) % 8 == 3;
  return how;
}

std::string Harness::where(const char* name) const {
  return "call " + std::to_string(call_) + " " + name + (what_.empty() ? "" : " " + what_);
}

// An injected fault must come back as itself: kInternal "injected fault: ...". A cache that
// could not take the call back says "the cache is unusable" (also kInternal, quoting the
// fault): with one one-shot fault that repair cannot fail, so that is a bug too.
static bool carries_injected_fault(const Status& st) {
  return st.code() == StatusCode::kInternal &&
         st.message().find("injected fault") != std::string::npos &&
         st.message().find("unusable") == std::string::npos;
}

void Harness::check_injected_status(const char* name, const Status& st) {
  if (!carries_injected_fault(st)) {
    fail(where(name) + ": the injected fault \"" + faults_->last_fault() + "\" came back as " +
         st.to_string());
  }
}

// Checks the rules that hold after any call; `st` is the call's status, `before` the state
// just before it. A tier-moving call (reserve, offload, restore, prefetch) that an injected
// fault made fail is held to diff_taken_back, any other failed call to diff. Returns true
// when the call failed because of an injected fault (the caller may retry it).
bool Harness::after(const char* name, const Status& st, const Snapshot& before, bool moves_tiers) {
  const bool fired = faults_->injected() != before.injected;
  // A failed event query may be absorbed: the poll that met it stops and is retried later, and
  // the call goes on, and may still fail for a reason of its own (a bad id, say). How many
  // queries a call makes depends on timing, so only this kind can fire unseen.
  const bool absorbed_query =
      fired && armed_kind_ == FaultKind::kQuery && !carries_injected_fault(st);
  if (tracing()) {
    // The call, its status and everything it changed.
    std::fprintf(stderr, "[%d] %s %s -> %s%s\n     changed:%s\n", call_, name, what_.c_str(),
                 st.to_string().c_str(),
                 fired && (st.ok() || absorbed_query) ? " (fault absorbed)" : "",
                 fuzz::diff(before, snapshot()).c_str());
  }
  const Status inv = cache_->check_invariants();
  if (!inv.ok()) {
    fail(where(name) + " (" + st.to_string() + ") broke an invariant: " + inv.to_string());
  }
  const std::vector<SequenceId> dropped = cache_->drain_evicted_sequences();
  const bool injected = !st.ok() && fired && !absorbed_query;
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
    evicted_since_drain_.push_back(id);
  }
  touch_batch(name, st);
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
Status Harness::own_call(const char* name, const std::function<Status()>& f) {
  const int64_t injected = faults_->injected();
  Status s = f();
  if (!s.ok() && faults_->injected() != injected) {
    check_injected_status(name, s);
    if (tracing()) std::fprintf(stderr, "    %s: %s, retried\n", name, s.to_string().c_str());
    s = f();
  }
  return s;
}

bool Harness::offloaded(SequenceId id) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int64_t injected = faults_->injected();
    const StatusOr<SequenceResidency> r = cache_->residency(id);
    if (!r.ok() && faults_->injected() != injected) {
      check_injected_status("residency", r.status());
      continue;  // one-shot: the next query does not meet it
    }
    if (!r.ok()) fail("residency of a live sequence: " + r.status().to_string());
    if (*r != SequenceResidency::kInFlight) return *r == SequenceResidency::kHost;
    sync();  // its copies finish: the next query says where it is
  }
  fail("residency: " + id_name(id) + " still in flight after synchronize");
}

void Harness::sync() {
  const Status s = own_call("synchronize", [this] { return cache_->synchronize(); });
  if (!s.ok()) fail("synchronize: " + s.to_string());
}

void Harness::step() {
  const uint8_t byte = in_.u8();
  const Snapshot before = snapshot();
  if (byte >= kFaultOp) return arm_fault();
  if (byte >= kPrefetchOp) return prefetch(before);
  if (byte >= kBatchOp) return batch_op(byte, before);
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
void Harness::arm_fault() {
  const uint8_t k = in_.u8();
  const FaultKind kind = static_cast<FaultKind>(k % kNumFaultKinds);
  const int64_t n = 1 + (k / kNumFaultKinds) % 4;
  faults_->disarm_all();
  faults_->fail_nth(kind, n);
  armed_kind_ = kind;
  if (tracing()) {
    std::fprintf(stderr, "[%d] arm fault: %s call #%lld from now\n", call_, fault_kind_name(kind),
                 static_cast<long long>(n));
  }
}

// Fills the input buffers with the model's rows of `m.planned` for one layer, in `dtype`
// with `stride` elements between rows.
void Harness::fill_inputs(const ModelSeq& m, int32_t layer, DType dtype, int64_t stride) {
  // Kernels read inputs asynchronously: earlier ones must be done before we overwrite them.
  sync();
  const int64_t start = static_cast<int64_t>(m.tokens.size());
  for (int part = 0; part < 2; ++part) {
    const std::vector<uint16_t> rows = testing::model_rows(config_, layer, part, m.planned, start);
    void* dst = part == 0 ? in_k_ : in_v_;
    for (size_t t = 0; t < m.planned.size(); ++t)
      for (int64_t e = 0; e < row_; ++e)
        store_from_float(dst, dtype, static_cast<int64_t>(t) * stride + e,
                         half_bits_to_float(rows[t * static_cast<size_t>(row_) + e]));
  }
}

// Gathers every layer of a device-resident sequence and compares it with the model.
void Harness::verify(SequenceId id, uint8_t how) {
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
    // An offloaded sequence is read only after a restore, also when every block it holds is
    // still on the device (a fork that shares them all, say).
    if (s.code() == StatusCode::kFailedPrecondition && offloaded(id)) return;
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
                             half_bits_to_float(testing::kv_value(t, tokens[static_cast<size_t>(t)],
                                                                  layer, part, h, d)));
            const float want = load_as_float(cell, config_.dtype, 0);
            const float got = static_cast<const float*>(part == 0 ? out_k_ : out_v_)[i];
            if (std::memcmp(&want, &got, 4) != 0) {
              fail("verify (call " + std::to_string(call_) + "): sequence " + id_name(id) +
                   " layer " + std::to_string(layer) + " part " + std::to_string(part) + " pos " +
                   std::to_string(t) + " head " + std::to_string(h) + " dim " + std::to_string(d) +
                   ": got " + std::to_string(got) + ", model " + std::to_string(want));
            }
          }
        }
  }
}

}  // namespace pagedkv::fuzz

// The cache logs each pool allocation at info level: one line per input would drown the fuzzer's
// own output and cost throughput.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  setenv("PAGEDKV_LOG_LEVEL", "warn", /*overwrite=*/0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pagedkv::fuzz::Reader in(data, size);
  pagedkv::fuzz::Harness h(in);
  h.run();
  return 0;
}
