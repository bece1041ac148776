#include "kv_workload.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "pagedkv/cpu_backend.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/ops.hpp"

namespace pagedkv::soak {
namespace {

constexpr int kNumPrefixes = 4;      // shared system prompts
constexpr TokenId kVocabulary = 50;  // small, so that prompts share full blocks often
constexpr int kMaxPromptTail = 10;   // tokens after the (optional) shared prefix
constexpr int kMaxExtend = 3;        // tokens per extend
constexpr int kPriorities = 3;       // scheduling priorities 0-2
constexpr size_t kAlign = 256;
constexpr size_t kMinUploadRing = 64 << 10;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

CacheConfig pressure_config() {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.block_size = 4;
  c.num_device_blocks = 24;
  c.num_host_blocks = 32;
  c.max_sequence_length = 64;
  c.backend = BackendKind::kCpu;
  return c;
}

uint16_t KvWorkload::expected_value(int64_t pos, TokenId token, int32_t layer, int32_t part,
                                    int32_t head, int32_t dim) {
  return KvValues::value(pos, token, layer, part, head, dim);
}

// ---- status bookkeeping ----

bool KvWorkload::is_injected(const Status& s) const {
  // FaultInjectionBackend's message, passed through (KvCache appends " (nothing changed)" when
  // it took a plan back). "the cache is unusable: after \"injected fault ..." is not one: the
  // cache gave up, and that is an error.
  return options_.tolerate_injected_faults && s.code() == StatusCode::kInternal &&
         s.message().rfind("injected fault", 0) == 0;
}

KvWorkload::KvWorkload(const WorkloadOptions& options)
    : options_(options), config_(options.config), rng_(options.seed) {}

StatusOr<std::unique_ptr<KvWorkload>> KvWorkload::create(const WorkloadOptions& options) {
  if (options.config.dtype != DType::kFloat16 && options.config.dtype != DType::kFloat32) {
    return invalid_argument("config.dtype: the workload's model needs an fp16 or fp32 pool");
  }
  if (options.verify_percent < 0 || options.verify_percent > 100) {
    return invalid_argument("verify_percent: must be in [0, 100]");
  }
  std::unique_ptr<KvWorkload> w(new KvWorkload(options));
  PAGEDKV_RETURN_IF_ERROR(w->init());
  return w;
}

Status KvWorkload::init() {
  if (options_.backend != nullptr) {
    backend_ = options_.backend;
  } else {
    CpuBackendOptions cpu;
    cpu.copy_delay = options_.copy_delay;
    owned_backend_ = create_cpu_backend(cpu);
    backend_ = owned_backend_.get();
  }
  io_ = options_.io_backend != nullptr ? options_.io_backend : backend_;
  PAGEDKV_RETURN_IF_ERROR(open_cache(options_.storage));

  // Gather buffers cover the longest sequence the device pool can hold.
  const int64_t row = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  const int64_t max_tokens = std::min<int64_t>(config_.max_sequence_length,
                                               config_.num_device_blocks * config_.block_size);
  gather_bytes_ = static_cast<size_t>(config_.num_layers * 2 * max_tokens * row) * 2;
  upload_ring_.bytes = std::max(
      kMinUploadRing, 16 * align_up(static_cast<size_t>(config_.num_layers * 2 * 32 * row * 2)));
  auto alloc_device = [&](size_t bytes, void** out) {
    return retry([&]() -> Status {
      PAGEDKV_ASSIGN_OR_RETURN(*out, io_->allocate_device(bytes));
      return ok_status();
    });
  };
  auto alloc_pinned = [&](size_t bytes, void** out) {
    return retry([&]() -> Status {
      PAGEDKV_ASSIGN_OR_RETURN(*out, io_->allocate_pinned(bytes));
      return ok_status();
    });
  };
  PAGEDKV_RETURN_IF_ERROR(alloc_device(upload_ring_.bytes, &upload_ring_.device));
  PAGEDKV_RETURN_IF_ERROR(alloc_pinned(upload_ring_.bytes, &upload_ring_.host));
  PAGEDKV_RETURN_IF_ERROR(alloc_device(gather_bytes_, &gather_device_));
  void* gather_host = nullptr;
  PAGEDKV_RETURN_IF_ERROR(alloc_pinned(gather_bytes_, &gather_host));
  gather_host_ = static_cast<uint16_t*>(gather_host);
  PAGEDKV_RETURN_IF_ERROR(alloc_pinned(gather_bytes_, &poison_host_));
  std::memset(poison_host_, 0xff, gather_bytes_);

  for (int p = 0; p < kNumPrefixes; ++p) {
    std::vector<TokenId> prefix;
    const int len = 4 + static_cast<int>(rng_() % 14);
    for (int i = 0; i < len; ++i) prefix.push_back(static_cast<TokenId>(rng_() % kVocabulary));
    prefixes_.push_back(std::move(prefix));
  }
  return ok_status();
}

Status KvWorkload::open_cache(StorageTier* storage) {
  options_.storage = storage;
  KvCacheOptions cache_options;
  cache_options.backend = backend_;
  cache_options.transfer_kernel_block_bytes = options_.transfer_kernel_block_bytes;
  cache_options.storage = storage;
  PAGEDKV_ASSIGN_OR_RETURN(cache_, KvCache::create(config_, cache_options));
  return ok_status();
}

Status KvWorkload::stop_cache() {
  Status s = ok_status();
  if (cache_ != nullptr) {
    s = sync_io();
    if (s.ok()) s = retry([&] { return cache_->flush_storage(); });
    if (!s.ok()) record_error(0, "flush_storage before a restart", s);
  }
  cache_.reset();
  while (!live_.empty()) erase_index(live_.size() - 1);
  return s;
}

Status KvWorkload::start_cache(StorageTier* storage) {
  const Status s = retry([&] { return open_cache(storage); });
  if (!s.ok()) record_error(0, "KvCache::create after a restart", s);
  return s;
}

KvWorkload::~KvWorkload() {
  if (cache_ != nullptr && io_ != nullptr) {
    // Our copies and the cache's kernels that read our buffers are on the compute stream. A
    // failed (injected) sync does not wait: try again.
    for (int i = 0; i < 4; ++i) {
      if (io_->synchronize_stream(cache_->compute_stream()).ok()) break;
    }
  }
  if (io_ != nullptr) {
    io_->free_device(upload_ring_.device);
    io_->free_pinned(upload_ring_.host);
    io_->free_device(gather_device_);
    io_->free_pinned(gather_host_);
    io_->free_pinned(poison_host_);
  }
  cache_.reset();
}

namespace {
const char* op_name(int op) {
  static const char* const kNames[] = {"add",        "extend", "rollback",   "fork",
                                       "finish",     "erase",  "offload",    "restore",
                                       "set_active", "verify", "verify_all", "prefetch"};
  return kNames[op];
}
}  // namespace

void KvWorkload::record_problem(int64_t* counter, const std::string& what) {
  ++*counter;
  if (counters_.first_problem.empty()) {
    counters_.first_problem = "step " + std::to_string(counters_.ops) + " op " +
                              op_name(static_cast<int>(op_)) + ": " + what;
  }
}

void KvWorkload::record_error(SequenceId id, const std::string& call, const Status& s) {
  if (is_injected(s)) {
    ++counters_.injected_faults;
    return;
  }
  record_problem(&counters_.errors, "seq " + std::to_string(id) + " " + call + " returned " +
                                        (s.ok() ? std::string("ok, unexpectedly") : s.to_string()));
}

bool KvWorkload::has_problem() const {
  return counters_.mismatches + counters_.invariant_failures + counters_.errors > 0;
}

// ---- the model ----

size_t KvWorkload::pick() { return static_cast<size_t>(rng_() % live_.size()); }

size_t KvWorkload::insert(SequenceId id) {
  Entry e;
  e.id = id;
  if (!spare_token_lists_.empty()) {
    e.tokens = std::move(spare_token_lists_.back());
    spare_token_lists_.pop_back();
    e.tokens.clear();
  }
  live_.push_back(std::move(e));
  index_of_[id] = live_.size() - 1;
  return live_.size() - 1;
}

void KvWorkload::erase_index(size_t index) {
  index_of_.erase(live_[index].id);
  spare_token_lists_.push_back(std::move(live_[index].tokens));
  if (index + 1 != live_.size()) {
    live_[index] = std::move(live_.back());
    index_of_[live_[index].id] = index;
  }
  live_.pop_back();
}

std::vector<SequenceId> KvWorkload::live_sequences() const {
  std::vector<SequenceId> ids;
  ids.reserve(live_.size());
  for (const Entry& e : live_) ids.push_back(e.id);
  return ids;
}

const std::vector<TokenId>& KvWorkload::model_tokens(SequenceId id) const {
  static const std::vector<TokenId> kNone;
  auto it = index_of_.find(id);
  return it == index_of_.end() ? kNone : live_[it->second].tokens;
}

// ---- workload I/O, on the cache's compute stream ----

Status KvWorkload::sync_io() {
  return retry([&] { return io_->synchronize_stream(cache_->compute_stream()); });
}

// ---- the run ----

void KvWorkload::run(int64_t ops) {
  for (int64_t i = 0; i < ops; ++i) {
    if (options_.stop_at_first_problem && has_problem()) return;
    step();
  }
}

void KvWorkload::step() {
  // The mix (out of 100): add 15, extend 30, a batched decode step 10, rollback 7, fork 5, finish
  // or erase 7, offload 8, restore 6 (a third of them prefetch instead), set_active 4, verify 8;
  // verify_percent rescales the rest.
  const int verify_percent = options_.verify_percent;
  const int r = static_cast<int>(rng_() % 100);
  if (r >= 100 - verify_percent) {
    op_ = Op::kVerify;
  } else {
    const int o = r * 92 / (100 - verify_percent);
    if (o < 15 || live_.empty())
      op_ = Op::kAdd;
    else if (o < 45)
      op_ = Op::kExtend;
    else if (o < 55)
      op_ = Op::kDecodeBatch;
    else if (o < 62)
      op_ = Op::kRollback;
    else if (o < 67)
      op_ = Op::kFork;
    else if (o < 74)
      op_ = Op::kFinish;  // or erase, below
    else if (o < 82)
      op_ = Op::kOffload;
    else if (o < 88)
      op_ = Op::kRestore;
    else
      op_ = Op::kSetActive;
  }
  if (op_ != Op::kAdd && op_ != Op::kSetActive && live_.empty()) op_ = Op::kAdd;
  switch (op_) {
    case Op::kAdd:
      add();
      break;
    case Op::kExtend:
      extend(pick());
      break;
    case Op::kDecodeBatch:
      decode_batch();
      break;
    case Op::kRollback:
      rollback(pick());
      break;
    case Op::kFork:
      fork(pick());
      break;
    case Op::kFinish:
    case Op::kErase: {
      const size_t index = pick();
      if (rng_() % 2 == 0) op_ = Op::kErase;
      remove(index, op_ == Op::kFinish);
      break;
    }
    case Op::kOffload:
      offload(pick());
      break;
    case Op::kRestore:
    case Op::kPrefetch:
      if (rng_() % 3 == 0) {
        op_ = Op::kPrefetch;
        prefetch();
      } else {
        restore(pick());
      }
      break;
    case Op::kSetActive:
      set_active();
      break;
    case Op::kVerify:
      verify_index(pick());
      break;
    case Op::kVerifyAll:
      break;
  }
  drain_evicted();
  check_invariants();
  ++counters_.ops;
}

void KvWorkload::check_invariants() {
  const Status s = cache_->check_invariants();
  if (!s.ok()) record_problem(&counters_.invariant_failures, s.to_string());
}

void KvWorkload::drain_evicted() {
  const std::vector<SequenceId> evicted = cache_->drain_evicted_sequences();
  // The control events are drained too (a server drains them; undrained they pile up), and
  // their kSequenceEvicted entries must name the same sequences.
  std::vector<ControlEvent> events = cache_->drain_events();
  counters_.events += static_cast<int64_t>(events.size());
  std::vector<SequenceId>& from_events = ids_scratch_;
  from_events.clear();
  for (const ControlEvent& e : events) {
    if (e.kind == EventKind::kSequenceEvicted) from_events.push_back(e.sequence);
  }
  if (from_events.size() != evicted.size() ||
      !std::is_permutation(evicted.begin(), evicted.end(), from_events.begin())) {
    record_problem(&counters_.errors, std::to_string(evicted.size()) +
                                          " sequences reported evicted but " +
                                          std::to_string(from_events.size()) +
                                          " kSequenceEvicted events (or other ids)");
  }
  for (SequenceId id : evicted) {
    auto it = index_of_.find(id);
    if (it == index_of_.end()) {
      record_problem(&counters_.errors,
                     "the cache reports evicting seq " + std::to_string(id) + ", not live");
      continue;
    }
    if (cache_->contains(id)) {
      record_problem(&counters_.errors,
                     "seq " + std::to_string(id) + " was reported evicted but still exists");
    }
    erase_index(it->second);
    ++counters_.evicted;
  }
}

void KvWorkload::add() {
  const SequenceId id = next_id_++;
  std::vector<TokenId>& prompt = prompt_scratch_;
  prompt.clear();
  if (rng_() % 3 != 0) {
    const std::vector<TokenId>& prefix = prefixes_[rng_() % prefixes_.size()];
    prompt.insert(prompt.end(), prefix.begin(), prefix.end());
  }
  const int tail = 1 + static_cast<int>(rng_() % kMaxPromptTail);
  for (int i = 0; i < tail; ++i) prompt.push_back(static_cast<TokenId>(rng_() % kVocabulary));

  SequenceOptions seq_options;
  seq_options.priority = static_cast<int32_t>(rng_() % kPriorities);  // who is offloaded first
  if (options_.storage != nullptr) fetch_from_storage(id, prompt, seq_options);
  const StatusOr<int64_t> cached = cache_->add_sequence(id, prompt, seq_options);
  const int64_t size = static_cast<int64_t>(prompt.size());
  if (!cached.ok()) {
    const StatusCode code = cached.status().code();
    if (code == StatusCode::kResourceExhausted) {
      ++counters_.exhausted;
    } else if (!(code == StatusCode::kOutOfRange && size > config_.max_sequence_length)) {
      record_error(id, "add_sequence", cached.status());
    }
    return;
  }
  if (*cached < 0 || *cached > size) {
    record_problem(&counters_.errors, "seq " + std::to_string(id) + " add_sequence of " +
                                          std::to_string(size) + " tokens reports " +
                                          std::to_string(*cached) + " cached");
    return;
  }
  const size_t index = insert(id);
  live_[index].tokens.assign(prompt.begin(), prompt.begin() + *cached);
  tokens_scratch_.assign(prompt.begin() + *cached, prompt.end());
  if (write_tokens(index, tokens_scratch_)) return;
  // No room for the prompt (or the write failed): the scheduler would preempt; we erase it.
  const Status s = retry([&] { return cache_->erase(id); });
  if (s.ok()) {
    erase_index(index);
  } else {
    record_error(id, "erase", s);  // it stays live with its cached tokens
  }
}

void KvWorkload::fetch_from_storage(SequenceId id, const std::vector<TokenId>& prompt,
                                    const SequenceOptions& options) {
  const bool wait = rng_() % 3 != 0;  // drawn before the call: the choices do not depend on it
  const StatusOr<int64_t> fetched = cache_->fetch_from_storage(prompt, options);
  if (!fetched.ok()) {
    record_error(id, "fetch_from_storage", fetched.status());
    return;
  }
  if (*fetched > 0) ++counters_.storage_fetches;
  if (!wait) return;
  const Status s = retry([&] { return cache_->flush_storage(); });
  if (!s.ok()) record_error(id, "flush_storage", s);
}

void KvWorkload::extend(size_t index) {
  std::vector<TokenId>& tokens = tokens_scratch_;
  tokens.resize(static_cast<size_t>(1 + rng_() % kMaxExtend));
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng_() % kVocabulary);
  write_tokens(index, tokens);
}

bool KvWorkload::write_tokens(size_t index, const std::vector<TokenId>& tokens) {
  const SequenceId id = live_[index].id;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t start = static_cast<int64_t>(live_[index].tokens.size());
  if (n == 0) return true;
  auto drop_reservation = [&] {
    const Status s = retry([&] { return cache_->rollback(id, start); });
    if (!s.ok()) record_error(id, "rollback of a reservation", s);
  };
  if (start + n > config_.max_sequence_length) {
    const StatusOr<std::vector<int64_t>> past = cache_->reserve(id, n);
    if (past.ok()) {
      record_problem(&counters_.errors, "seq " + std::to_string(id) + " reserve of " +
                                            std::to_string(n) + " tokens past " +
                                            std::to_string(config_.max_sequence_length) +
                                            " succeeded");
      drop_reservation();
    } else if (past.status().code() != StatusCode::kOutOfRange) {
      record_error(id, "reserve past max_sequence_length", past.status());
    }
    return false;
  }

  const StatusOr<std::vector<int64_t>> slots = cache_->reserve(id, n);
  if (!slots.ok()) {
    if (slots.status().code() == StatusCode::kResourceExhausted) {
      ++counters_.exhausted;
    } else {
      record_error(id, "reserve", slots.status());
    }
    return false;
  }
  const int64_t max_slot = config_.num_device_blocks * config_.block_size;
  bool slots_ok = static_cast<int64_t>(slots->size()) == n;
  for (int64_t slot : *slots) slots_ok = slots_ok && slot >= 0 && slot < max_slot;
  if (!slots_ok) {
    record_problem(&counters_.errors, "seq " + std::to_string(id) +
                                          " reserve returned bad slots for " + std::to_string(n) +
                                          " tokens");
    drop_reservation();
    return false;
  }

  positions_scratch_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions_scratch_[static_cast<size_t>(t)] = start + t;
  const StatusOr<char*> staged = stage_kv(positions_scratch_, tokens);
  if (!staged.ok()) {
    record_error(id, "staging K/V", staged.status());
    drop_reservation();
    return false;
  }
  char* device = *staged;
  const size_t part_bytes =
      static_cast<size_t>(n) * static_cast<size_t>(config_.num_kv_heads) * config_.head_dim * 2;
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const char* k = device + static_cast<size_t>(2 * l) * part_bytes;
    const char* v = k + part_bytes;
    auto write = [&] { return cache_->write_kv(id, l, k, v, DType::kFloat16); };
    Status s = write();
    if (!s.ok() && is_injected(s)) {  // a failed write_kv changes nothing: try once more
      ++counters_.injected_faults;
      s = write();
    }
    if (!s.ok()) {
      record_error(id, "write_kv layer " + std::to_string(l), s);
      drop_reservation();
      return false;
    }
  }
  Status c = cache_->commit(id, tokens);
  if (!c.ok() && is_injected(c)) {
    ++counters_.injected_faults;
    c = cache_->commit(id, tokens);
  }
  if (!c.ok()) {
    record_error(id, "commit", c);
    drop_reservation();
    return false;
  }
  std::vector<TokenId>& model = live_[index].tokens;
  model.insert(model.end(), tokens.begin(), tokens.end());
  return true;
}

StatusOr<char*> KvWorkload::stage_kv(const std::vector<int64_t>& positions,
                                     const std::vector<TokenId>& tokens) {
  // [layer][K, V][n][heads][dim] in one slice of the upload ring.
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t row = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  const size_t part_bytes = static_cast<size_t>(n * row) * 2;
  const size_t bytes = part_bytes * 2 * static_cast<size_t>(config_.num_layers);
  const size_t slice = align_up(bytes);
  Ring& ring = upload_ring_;
  if (slice > ring.bytes) {  // larger than the ring: grow it (after the stream is idle)
    PAGEDKV_RETURN_IF_ERROR(sync_io());
    io_->free_device(ring.device);
    io_->free_pinned(ring.host);
    ring.device = ring.host = nullptr;
    ring.bytes = 0;  // until both allocations succeed
    const size_t grown = 4 * slice;
    PAGEDKV_RETURN_IF_ERROR(retry([&]() -> Status {
      PAGEDKV_ASSIGN_OR_RETURN(ring.device, io_->allocate_device(grown));
      return ok_status();
    }));
    PAGEDKV_RETURN_IF_ERROR(retry([&]() -> Status {
      PAGEDKV_ASSIGN_OR_RETURN(ring.host, io_->allocate_pinned(grown));
      return ok_status();
    }));
    ring.bytes = grown;
    ring.used = 0;
  }
  if (ring.used + slice > ring.bytes) {  // wrap: earlier slices may still be read
    PAGEDKV_RETURN_IF_ERROR(sync_io());
    ring.used = 0;
  }
  const size_t offset = ring.used;
  ring.used += slice;
  auto* host = reinterpret_cast<uint16_t*>(static_cast<char*>(ring.host) + offset);
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    for (int32_t part = 0; part < 2; ++part) {
      for (int64_t t = 0; t < n; ++t, host += row) {
        values_.row(positions[static_cast<size_t>(t)], tokens[static_cast<size_t>(t)], l, part,
                    config_.num_kv_heads, config_.head_dim, host);
      }
    }
  }
  char* device = static_cast<char*>(ring.device) + offset;
  PAGEDKV_RETURN_IF_ERROR(retry([&] {
    return io_->copy_async(device, static_cast<char*>(ring.host) + offset, bytes,
                           CopyKind::kHostToDevice, cache_->compute_stream());
  }));
  return device;
}

void KvWorkload::rollback(size_t index) {
  Entry& e = live_[index];
  const int64_t length = static_cast<int64_t>(rng_() % (e.tokens.size() + 1));
  const Status s = cache_->rollback(e.id, length);
  if (!s.ok()) {
    record_error(e.id, "rollback to " + std::to_string(length), s);
    return;
  }
  e.tokens.resize(static_cast<size_t>(length));
}

void KvWorkload::fork(size_t index) {
  const SequenceId parent = live_[index].id;
  const SequenceId child = next_id_++;
  const Status s = cache_->fork(parent, child);
  if (!s.ok()) {  // an offloaded parent cannot be forked
    if (s.code() == StatusCode::kFailedPrecondition) return;
    if (s.code() == StatusCode::kResourceExhausted) {
      ++counters_.exhausted;
      return;
    }
    record_error(parent, "fork into " + std::to_string(child), s);
    return;
  }
  const size_t c = insert(child);  // may move live_: index the parent again
  live_[c].tokens = live_[index].tokens;
}

void KvWorkload::remove(size_t index, bool finish) {
  const SequenceId id = live_[index].id;
  const Status s = finish ? cache_->finish(id) : cache_->erase(id);
  if (!s.ok()) {
    record_error(id, finish ? "finish" : "erase", s);
    return;
  }
  erase_index(index);
}

void KvWorkload::offload(size_t index) {
  const SequenceId id = live_[index].id;
  const Status s = cache_->offload(id);
  if (s.ok()) {
    ++counters_.offload_calls;
  } else if (s.code() == StatusCode::kResourceExhausted) {
    ++counters_.exhausted;
  } else if (s.code() != StatusCode::kFailedPrecondition) {  // active or already offloaded
    record_error(id, "offload", s);
  }
}

void KvWorkload::restore(size_t index) {
  const SequenceId id = live_[index].id;
  const Status s = cache_->restore(id);
  if (s.ok()) {
    ++counters_.restore_calls;
  } else if (s.code() == StatusCode::kResourceExhausted) {
    ++counters_.exhausted;
  } else if (s.code() != StatusCode::kFailedPrecondition) {  // not offloaded
    record_error(id, "restore", s);
  }
}

void KvWorkload::prefetch() {
  std::vector<SequenceId>& ids = ids_scratch_;
  ids.clear();
  const int n = 1 + static_cast<int>(rng_() % 3);  // may repeat an id, which prefetch allows
  for (int i = 0; i < n; ++i) ids.push_back(live_[pick()].id);
  const Status s = cache_->prefetch(ids);
  if (s.ok()) {
    ++counters_.prefetch_calls;
  } else {
    record_error(ids[0], "prefetch of " + std::to_string(ids.size()) + " sequences", s);
  }
}

void KvWorkload::set_active() {
  std::vector<SequenceId>& active = ids_scratch_;
  active.clear();
  for (const Entry& e : live_) {
    if (rng_() % 4 == 0) active.push_back(e.id);
  }
  const Status s = cache_->set_active(active);
  if (!s.ok()) record_error(0, "set_active of " + std::to_string(active.size()), s);
}

}  // namespace pagedkv::soak
