// The harness of the KvCache libFuzzer target (docs/fuzzing.md): it decodes the input into a
// bounded program of KvCache calls, keeps a reference model of every live sequence and checks
// the contract after every call. Its methods live in three files:
//   kv_cache_fuzz.cpp  setup, decoding, the checks after every call, verification, entry points;
//   sequence_ops.cpp   the per-sequence calls (add, reserve, write_kv, commit, ... prefetch);
//   batch_ops.cpp      the batched calls (reserve_batch, build_batch + write_kv_batch +
//                      commit_batch as a decode step, stale batches, bad commit_batch) and
//                      drain_events.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_snapshot.hpp"
#include "memory_store.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/fault_injection.hpp"

namespace pagedkv::fuzz {

inline constexpr int kMaxCalls = 64;
inline constexpr int32_t kMaxSeqLen = 40;
inline constexpr int kMaxTrackedIds =
    10;  // ids 1..9 are the fuzzer's names, plus 0 (and UINT64_MAX)
// Opcode bytes: below kBatchOp, byte % 16 picks one of the original 16 calls; the ranges above
// were added later (corpus inputs with such bytes changed meaning).
inline constexpr uint8_t kBatchOp = 208;     // 208-223: batched calls, (byte - 208) / 4 picks
inline constexpr uint8_t kPrefetchOp = 224;  // 224-239
inline constexpr uint8_t kFaultOp = 240;     // 240-255

/// Prints "kv_cache_fuzz: <what>" and aborts, so libFuzzer saves the input.
[[noreturn]] void fail(const std::string& what);
/// PAGEDKV_FUZZ_TRACE is set (and not 0): print every call.
bool tracing();

// The process-wide backends: a CPU backend, and the fault injector wrapped around it that the
// caches use. One for the whole process: the CPU backend's worker threads would otherwise be
// created and joined for every input, which dominated the cost of a small input. The harness's
// own buffers (and their memsets) go to the inner backend, so only the cache's calls are
// counted and failed.
struct Backends {
  Backend* inner;
  FaultInjectionBackend* faults;
};
Backends& backends();

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

std::string ids_string(const std::vector<SequenceId>& ids);

// How a write_kv call hands its input over, decoded from one byte (the write opcode's).
struct WriteHow {
  DType dtype = DType::kFloat16;
  int64_t stride = 0;  // row stride in elements; 0: packed
  bool null_key = false;
  bool null_value = false;
  bool misaligned = false;  // the key pointer one byte off
};

// The last DeviceBatch that build_batch returned, and what the harness knows about it.
struct BatchRecord {
  bool built = false;  // a build_batch succeeded in this input
  DeviceBatch batch;
  std::vector<SequenceId> ids;
  // Per slot-mapping row before the padding: the member and the index into its planned tokens.
  std::vector<std::pair<SequenceId, int64_t>> rows;
  int64_t padded_rows = 0;  // slot_mapping.size(): rows plus -1 padding
  // batch.host->slot_mapping as build_batch returned it: a write that KvCache accepts goes
  // through these slots, so the host copy must not have changed under a current batch.
  std::vector<int64_t> slots;
  // A successful call since that KvCache counts as changing a batch (reserve, commit, rollback,
  // tier move, fork, finish, erase, add_sequence, build_batch): write_kv_batch must refuse it.
  bool stale = false;
  // A call since failed: it changed nothing, yet some failures still move the cache's batch
  // generation (docs/fuzzing.md), so either answer is allowed; the bytes are still checked.
  bool maybe_stale = false;
};

class Harness {
 public:
  explicit Harness(Reader& in) : in_(in) {}
  void run();

 private:
  // ---- kv_cache_fuzz.cpp ----
  bool create();
  void* alloc(size_t bytes);
  // A sequence id: mostly a live one, sometimes any id (unknown, erased, 0, huge).
  SequenceId pick_id();
  // A count: mostly small, sometimes negative, zero, past the limit or huge.
  int64_t pick_count();
  TokenId pick_token() { return static_cast<TokenId>(in_.u8() % 6); }
  std::vector<SequenceId> pick_ids();  // n % 4 ids
  WriteHow pick_write_how();
  Snapshot snapshot() const { return take_snapshot(*cache_, faults_->injected()); }

  // Names the call about to be made, for PAGEDKV_FUZZ_TRACE and failure messages.
  template <typename... Args>
  void note(const char* format, Args... args) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), format, args...);
    what_ = buf;
  }
  std::string where(const char* name) const;
  void check_injected_status(const char* name, const Status& st);
  bool after(const char* name, const Status& st, const Snapshot& before, bool moves_tiers = false);
  Status own_call(const char* name, const std::function<Status()>& f);
  void sync();
  // Whether `id` is offloaded, from KvCache::residency once its transfers are done (an armed
  // event fault that the query meets is retried). An offloaded sequence can hold only device
  // blocks (a fork that shares them all), so the block tiers do not tell.
  bool offloaded(SequenceId id);
  void step();
  void arm_fault();
  void fill_inputs(const ModelSeq& m, int32_t layer, DType dtype, int64_t stride);
  void verify(SequenceId id, uint8_t how);

  // ---- sequence_ops.cpp ----
  void add(const Snapshot& before);
  void reserve(const Snapshot& before);
  void write(const Snapshot& step_before);
  void commit(const Snapshot& before);
  void rollback(const Snapshot& before);
  void fork(const Snapshot& before);
  void remove(const Snapshot& before, bool finish);
  void set_active(const Snapshot& before);
  void set_priority(const Snapshot& before);
  void offload(const Snapshot& before);
  void restore(const Snapshot& before);
  void prefetch(const Snapshot& before);
  void build_batch(const Snapshot& before);
  void extend(const Snapshot& before);
  void bad_gather(const Snapshot& before);
  // With a storage tier: fetches the prompt's blocks from it and waits for them, so that no
  // arrival lands inside a later call (which, failing, must change nothing).
  void fetch_from_storage(const std::vector<TokenId>& prompt, const SequenceOptions& options);

  // ---- batch_ops.cpp ----
  void batch_op(uint8_t byte, const Snapshot& before);
  void reserve_batch(const Snapshot& before);
  void decode_step(const Snapshot& before);
  void write_batch(const Snapshot& step_before);
  void commit_batch(const Snapshot& before);
  void drain_events(const Snapshot& before);
  // n % 5 ids (duplicates, unknown and offloaded ones included).
  std::vector<SequenceId> pick_batch_ids();
  // Checks that reserve_batch's slots are the members' reserved positions, grouped by member.
  void check_batch_slots(const std::vector<SequenceId>& ids, int64_t n_each,
                         const std::vector<int64_t>& slots);
  // Records a built batch (the model's rows) and checks its host metadata against the model.
  void record_batch(const std::vector<SequenceId>& ids, const BatchOptions& options,
                    const DeviceBatch& batch);
  // Fills the batch input buffers with the model's rows of `rec` for layers [first, first + n)
  // (padding rows with a poison); false, filling nothing, for an input dtype, row stride or
  // layer stride that the model cannot describe or the call must refuse.
  bool fill_batch_inputs(const BatchRecord& rec, int32_t first_layer, int32_t num_layers,
                         const WriteHow& how, int64_t layer_stride);
  // write_kv_batch or write_kv_batch_all_layers (layer < 0) through `rec`, with the model's
  // rows, packed fp16; an injected fault is retried once. Returns the final status.
  Status write_batch_rows(const char* name, const BatchRecord& rec, int32_t layer);
  // A stale batch (or none) must be refused with kFailedPrecondition; the current one must not.
  void check_batch_answer(const char* name, const BatchRecord& rec, const Status& st);
  // The model after a successful write through `rec` of `layers` (bit mask) in `dtype`.
  void note_batch_written(const BatchRecord& rec, uint32_t layers, DType dtype);
  // The model after a successful commit_batch of the first n_each planned tokens of each id.
  void note_committed(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                      int64_t n_each, bool wrong_token);
  // Called by after(): a call that KvCache counts as changing a batch makes the recorded batch
  // stale when it succeeds and maybe stale when it fails.
  void touch_batch(const char* name, const Status& st);

  Reader& in_;
  CacheConfig config_;
  Backend* inner_ = nullptr;                 // process-wide, see backends()
  FaultInjectionBackend* faults_ = nullptr;  // process-wide, wraps inner_; the cache's backend
  FaultKind armed_kind_ = FaultKind::kCopy;  // the kind arm_fault() armed last (one at a time)
  std::vector<std::unique_ptr<void, std::function<void(void*)>>> buffers_;
  std::unique_ptr<MemoryStore> store_;  // the storage tier, when the input asks for one
  std::unique_ptr<KvCache> cache_;      // declared after the buffers and store: destroyed first
  void* in_k_ = nullptr;
  void* in_v_ = nullptr;
  void* out_k_ = nullptr;
  void* out_v_ = nullptr;
  // write_kv_batch inputs: grown on demand (every layer of every batch row, with strides).
  void* batch_k_ = nullptr;
  void* batch_v_ = nullptr;
  size_t batch_bytes_ = 0;
  int64_t row_ = 0;
  int64_t now_ns_ = 0;
  int call_ = 0;
  std::string what_;     // the call being made, with its arguments (note())
  bool trusted_ = true;  // false once bytes were written that the model cannot describe
  std::map<SequenceId, ModelSeq> model_;
  BatchRecord batch_;
  size_t event_capacity_ = 0;
  int64_t events_dropped_drained_ = 0;           // stats().events_dropped at the last drain
  std::vector<SequenceId> evicted_since_drain_;  // reported by drain_evicted_sequences()
};

}  // namespace pagedkv::fuzz
