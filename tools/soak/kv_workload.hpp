// KvWorkload: a seeded, randomized end-to-end workload over the public KvCache API, checked
// against a reference model. The suite (tests/runtime/kv_cache_random_test.cpp) and the soak
// tool (pagedkv_soak) both run it; docs/soak.md describes it.
//
// One op is one API-level action on a randomly chosen sequence: add (a prompt that often starts
// with one of a few shared prefixes; reserve + write_kv every layer + commit of the uncached
// part), extend by 1-3 tokens, a batched decode step of a few sequences, rollback, fork,
// finish, erase, offload, restore, prefetch, set_active, or verify. After every op the cache's
// invariants are checked, the sequences it dropped (drain_evicted_sequences) leave the model, and
// the control events are drained (their kSequenceEvicted entries must name the same sequences).
//
// The model is each live sequence's committed token list. The K/V of a position is a pure
// function of (position, token, layer, part, head, dim), so after any mix of prefix reuse,
// copy-on-write and tier moves a gathered sequence must equal the model byte for byte. A verify
// (an op, and verify_all) restores the sequence when it is offloaded, gathers every layer and
// compares every element of keys and values, and also checks length() and pending() and the
// sequence's row of build_batch (length, block table) against block_locations().
//
// Counters: `mismatches` counts (sequence, layer) pairs whose gathered bytes differ from the
// model (plus sequences whose length(), pending() or build_batch row differs from it);
// `invariant_failures` counts failed check_invariants() calls; `errors` counts calls that
// returned a status the contract does not allow at that point (kResourceExhausted and
// kFailedPrecondition where those are legitimate answers are not errors). The first problem of
// any kind is described in `first_problem`.
//
// Injected faults: with `tolerate_injected_faults`, a call that fails with kInternal and a
// message starting with "injected fault" (FaultInjectionBackend's, which KvCache passes through)
// is counted in `injected_faults`, the model is left as it was (a failed call changes nothing),
// and the workload carries on: a failed write_kv is retried once and otherwise the reservation
// is rolled back; a failed commit likewise; the workload's own uploads, downloads and syncs are
// retried. Verification still compares every byte, which is how a lost or corrupted block after
// a fault shows. A cache that declares itself unusable after a fault it could not take back is
// an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv_values.hpp"
#include "pagedkv/backend.hpp"
#include "pagedkv/cache.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/status.hpp"

namespace pagedkv::soak {

/// The small configuration that puts both tiers under pressure: 2 layers x 2 KV heads x 16
/// dims fp16, 4-token blocks, 24 device blocks, 32 host blocks, sequences of at most 64 tokens,
/// CPU backend.
CacheConfig pressure_config();

/// What to run and on what.
struct WorkloadOptions {
  /// Seeds every random choice. With the same seed and config the same ops run: the choices do
  /// not depend on how fast the copies are.
  uint64_t seed = 1;
  /// The cache's configuration. Pools must be fp16 or fp32 (the model's values are fp16).
  CacheConfig config = pressure_config();
  /// The cache's backend (not owned; must outlive the workload). Null: the workload creates a
  /// CPU backend with `copy_delay`.
  Backend* backend = nullptr;
  /// Backend for the workload's own uploads and downloads (not owned). Null: the cache's. It
  /// must share memory and the default stream with the cache's backend (a wrapper around it,
  /// or the backend a wrapper wraps).
  Backend* io_backend = nullptr;
  /// Delay of each copy on the CPU backend's created streams (the transfer engine's copy
  /// stream), so that transfers really lag; used only when the workload creates its backend.
  std::chrono::microseconds copy_delay{50};
  /// KvCacheOptions::transfer_kernel_block_bytes: 0 sends every offload and restore through
  /// batched copies; the default sends the small blocks of pressure_config() through the copy
  /// kernel.
  int64_t transfer_kernel_block_bytes = kDefaultTransferKernelBlockBytes;
  /// Count "injected fault" failures in `injected_faults` and carry on (see the file comment).
  bool tolerate_injected_faults = false;
  /// Out of 100 ops, how many are verifies of a random sequence.
  int32_t verify_percent = 8;
  /// Stop run() at the first mismatch, invariant failure or error (the model may no longer
  /// describe the cache after one); false keeps going and keeps counting.
  bool stop_at_first_problem = true;
  /// A storage tier behind the host tier (KvCacheOptions::storage; not owned). Each add first
  /// fetches its prompt's blocks from it and, two times in three, waits for them
  /// (flush_storage), so that its prefix hit includes them and the verifies read them.
  StorageTier* storage = nullptr;
};

/// What a workload did and found.
struct WorkloadCounters {
  int64_t ops = 0;
  int64_t mismatches = 0;          // (sequence, layer) pairs (or lengths) unlike the model
  int64_t invariant_failures = 0;  // check_invariants() failures
  int64_t errors = 0;              // statuses the contract does not allow there
  int64_t injected_faults = 0;     // tolerated "injected fault" failures
  int64_t verified_sequences = 0;  // sequences whose every committed byte was compared
  int64_t verified_bytes = 0;      // K and V bytes compared
  int64_t unverifiable = 0;        // verifies skipped: no room to restore the sequence
  int64_t exhausted = 0;           // kResourceExhausted answers (reserve, restore, offload...)
  int64_t evicted = 0;             // sequences the cache dropped to make room
  int64_t events = 0;              // control events drained (drain_events())
  int64_t offload_calls = 0;       // successful explicit offload() calls
  int64_t restore_calls = 0;       // successful explicit restore() calls (verifies included)
  int64_t prefetch_calls = 0;      // successful prefetch() calls
  int64_t storage_fetches = 0;     // fetch_from_storage() calls that started reading blocks
  std::string first_problem;       // step, op, sequence and status or position of the first
};

/// A randomized workload over one KvCache. Single-threaded, like the cache.
class KvWorkload {
 public:
  /// Creates the backend (unless given), the cache and the workload's buffers.
  /// kInvalidArgument for a pool dtype other than fp16/fp32 (the model's values are fp16) or a
  /// verify_percent outside [0, 100]; otherwise what KvCache::create or an allocation returned.
  static StatusOr<std::unique_ptr<KvWorkload>> create(const WorkloadOptions& options);
  ~KvWorkload();
  KvWorkload(const KvWorkload&) = delete;
  KvWorkload& operator=(const KvWorkload&) = delete;

  /// Runs `ops` more ops (fewer when stop_at_first_problem stops it).
  void run(int64_t ops);
  /// Verifies every live sequence (restoring offloaded ones where there is room).
  void verify_all();
  /// A restart over the same storage, in two halves: stop_cache() waits for the storage tier's
  /// write-backs and destroys the cache (the model forgets every sequence); start_cache() builds
  /// a new one on `storage` (a new store object on the same directory, as a new process would
  /// open it; null: none). Between them the caller may replace the store. A failure is
  /// recorded as an error and returned.
  Status stop_cache();
  Status start_cache(StorageTier* storage);
  /// Verifies one live sequence now; false when it is not in the model or could not be
  /// verified (no room to restore it, or a problem, which the counters record).
  bool verify_sequence(SequenceId id);

  /// True once a mismatch, invariant failure or error has been recorded.
  bool has_problem() const;
  const WorkloadCounters& counters() const { return counters_; }
  KvCache& cache() { return *cache_; }
  /// Ids of the live sequences of the model, in no particular order.
  std::vector<SequenceId> live_sequences() const;
  /// The committed tokens the model expects of a live sequence (empty when unknown).
  const std::vector<TokenId>& model_tokens(SequenceId id) const;
  /// The fp16 bits the model expects at (position, token, layer, part, head, dim).
  static uint16_t expected_value(int64_t pos, TokenId token, int32_t layer, int32_t part,
                                 int32_t head, int32_t dim);

 private:
  enum class Op : uint8_t {
    kAdd,
    kExtend,
    kRollback,
    kFork,
    kFinish,
    kErase,
    kOffload,
    kRestore,
    kSetActive,
    kVerify,
    kVerifyAll,
    kPrefetch,
    kDecodeBatch,
  };
  struct Entry {
    SequenceId id = 0;
    std::vector<TokenId> tokens;
  };
  // Device buffer with a host mirror, used as a ring: a slice is taken per transfer and the
  // stream is synchronized only when the ring wraps.
  struct Ring {
    void* device = nullptr;
    void* host = nullptr;
    size_t bytes = 0;
    size_t used = 0;
  };

  explicit KvWorkload(const WorkloadOptions& options);
  Status init();
  // Creates the cache over `storage` (may be null).
  Status open_cache(StorageTier* storage);

  void step();
  void add();
  // Fetches the blocks of `prompt` the storage tier holds (for sequence `id`, about to be
  // added), waiting for them two times in three.
  void fetch_from_storage(SequenceId id, const std::vector<TokenId>& prompt,
                          const SequenceOptions& options);
  void extend(size_t index);
  void rollback(size_t index);
  void fork(size_t index);
  void remove(size_t index, bool finish);
  void offload(size_t index);
  void restore(size_t index);
  void prefetch();
  void set_active();
  // Reserves, writes and commits `tokens` after the committed ones. False when nothing was
  // committed (out of blocks, a fault, an error); the cache and the model are then unchanged.
  bool write_tokens(size_t index, const std::vector<TokenId>& tokens);
  // One decode step of a few sequences through the batched calls: reserve_batch, build_batch,
  // write_kv_batch (every layer, or all layers in one launch), commit_batch.
  void decode_batch();
  // Uploads the model's K/V of `tokens` at `positions` as [layer][K, V][n][heads][dim] fp16 on
  // the compute stream (one slice of the upload ring) and returns the device address.
  StatusOr<char*> stage_kv(const std::vector<int64_t>& positions,
                           const std::vector<TokenId>& tokens);
  bool verify_index(size_t index);
  // verify_sequence() without setting the op named in first_problem.
  bool verify_one(SequenceId id);
  void drain_evicted();
  void check_invariants();

  // The model.
  size_t pick();
  size_t insert(SequenceId id);
  void erase_index(size_t index);

  // Status bookkeeping: an injected fault (when tolerated) is counted and is not an error.
  bool is_injected(const Status& s) const;
  // Counts `s` as an injected fault or records it as an error of `call`.
  void record_error(SequenceId id, const std::string& call, const Status& s);
  void record_problem(int64_t* counter, const std::string& what);
  // Retries a call of the workload's own I/O (or a cache call that changes nothing when it
  // fails) while it fails with a tolerated injected fault, at most 16 times.
  template <typename F>
  Status retry(F&& call);
  static constexpr int kMaxInjectedRetries = 16;
  // Waits for the cache's compute stream, which the workload's copies are queued on.
  Status sync_io();

  WorkloadOptions options_;
  CacheConfig config_;
  std::unique_ptr<Backend> owned_backend_;
  Backend* backend_ = nullptr;
  Backend* io_ = nullptr;
  std::unique_ptr<KvCache> cache_;
  std::mt19937_64 rng_;
  WorkloadCounters counters_;

  std::vector<Entry> live_;
  std::unordered_map<SequenceId, size_t> index_of_;
  std::vector<std::vector<TokenId>> prefixes_;
  std::vector<std::vector<TokenId>> spare_token_lists_;  // reused by new entries
  SequenceId next_id_ = 1;
  Op op_ = Op::kAdd;

  // Buffers reused by every op.
  Ring upload_ring_;
  void* gather_device_ = nullptr;  // [layer][K, V][tokens][heads * dim] fp16, longest sequence
  uint16_t* gather_host_ = nullptr;
  void* poison_host_ = nullptr;  // 0xff bytes: fp16 NaN, never a model value
  size_t gather_bytes_ = 0;
  std::vector<TokenId> prompt_scratch_;
  std::vector<TokenId> tokens_scratch_;
  std::vector<SequenceId> ids_scratch_;
  std::vector<int64_t> positions_scratch_;
  std::vector<uint16_t> row_scratch_;  // one token's expected row
  KvValues values_;
};

template <typename F>
Status KvWorkload::retry(F&& call) {
  for (int attempt = 0;; ++attempt) {
    Status s = call();
    if (s.ok() || !is_injected(s)) return s;
    ++counters_.injected_faults;
    if (attempt == kMaxInjectedRetries) return s;
  }
}

}  // namespace pagedkv::soak
