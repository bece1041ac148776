// KvCache: the class a server embeds. It wires the control plane (which block holds which
// tokens), the data plane (kernels that move K/V bytes) and the two tiers (device pool, pinned
// host pool) together, and moves blocks between tiers on a copy stream without stalling the
// compute stream.
//
// One owner thread drives it; it is not internally locked. Every method validates first and
// either succeeds or returns an error with a message, leaving the cache as it was. When the
// backend fails part way through a call that moves blocks (a copy or launch error), the call is
// taken back: the control plane's plan is undone and the bytes already moved are copied back,
// so every sequence keeps its data where it was and stays usable; only cached blocks nobody
// referenced that it evicted, and victims it dropped (drain_evicted_sequences), stay gone. If
// even that repair fails, every later call returns the kInternal error that says so.
//
// Several KV groups (a config with `groups`: full-attention and MLA latent groups, and up to
// three sliding-window groups, as gpt-oss and Gemma 2/3 have) live in one KvCache whose groups
// share the logical blocks (core::ControlPlane, "several KV groups"): one sequence table, prefix
// tree and planner for all of them, and per group its own device and host pools. The calls are the
// one-group calls; layer indices are the model's (CacheConfig::groups lists each group's), each
// group has its own batch (build_batches) and device view, and ModelKvCache offers the same
// cache with the model-level calls (ModelKvCacheOptions::share_blocks).
//
// Under tensor parallelism (KvCacheOptions::tp_size = N) the one control plane drives N ranks'
// pools, rank r holding its slice of every group's KV heads in the same block ids: decisions,
// block tables and events are made once; moves and copy-on-write run on every rank, and the
// per-rank calls (write_kv, gather_layer, rank_batch, device_pool, ...) name the rank
// (docs/scale-out.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/backend.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/control_types.hpp"
#include "pagedkv/device/paged_view.cuh"  // compiles with any C++17 compiler
#include "pagedkv/ops.hpp"
#include "pagedkv/regions.hpp"
#include "pagedkv/status.hpp"
#include "pagedkv/step_plan.hpp"
#include "pagedkv/storage_tier.hpp"

namespace pagedkv {

/// KvCacheOptions::transfer_kernel_block_bytes by default. A guess, not yet measured on a GPU:
/// bench_transfer's BM_ScatteredOffload / BM_ScatteredRestore rows (path:1 batched copy, path:2
/// copy kernel) give the block size at which the two meet (docs/runtime.md, Transfer engine).
inline constexpr int64_t kDefaultTransferKernelBlockBytes = int64_t{64} << 10;

/// The largest step a server will run, for sizing what a step needs up front.
struct StepShape {
  int32_t max_batch = 0;                // sequences in one build_batch
  int32_t max_blocks_per_sequence = 0;  // blocks of the longest of them
  int64_t max_tokens = 0;               // slots reserved in one step, over the batch
};

/// Options of a KvCache that are not part of the configuration.
struct KvCacheOptions {
  /// Executor to use; not owned, must outlive the cache. Null: create one from config.backend
  /// on `device`.
  Backend* backend = nullptr;
  /// The device of the backend the cache creates when `backend` is null (create_backend): a
  /// CUDA ordinal, -1 for the device current at creation. Must be -1 with `backend`.
  int32_t device = -1;
  /// Stream for the cache's kernels and uploads ({}: the backend's default stream, which on
  /// CUDA is a blocking stream, so work on the legacy stream 0 is ordered with it).
  Stream compute_stream{};
  /// The caller's own stream (a cudaStream_t; on the CPU backend any non-null handle), used
  /// instead of compute_stream when set: every cache operation is queued on it, so it sees what
  /// the model queued there before the call, and the model's later work sees its results
  /// (transfers on the copy stream are ordered with it by events). Not owned.
  void* native_compute_stream = nullptr;
  /// With a step shape, the upload arena that carries each step's batch metadata is sized now
  /// (all its chunks, each large enough for a step of that shape), so a step of at most that
  /// shape never allocates; a larger one still works and grows the arena then. All zero (the
  /// default): the arena starts small and grows on demand. kInvalidArgument for a negative field.
  StepShape step_shape;
  /// Nanosecond clock for retention expiry; defaults to steady_clock.
  std::function<int64_t()> clock;
  /// Record control events for drain_events(), up to event_capacity between drains; a server
  /// that does not read them can turn this off.
  bool enable_events = true;
  /// The most control events held between drains (>= 1, else kInvalidArgument from create()).
  /// When full, the oldest are dropped and the next drain begins with one kEventsDropped event
  /// (resync), so an undrained cache stays bounded.
  size_t event_capacity = 65536;
  /// A storage tier behind the host tier (not owned; must outlive the cache and serve only it):
  /// cached host blocks that the host LRU drops are written back to it, and
  /// fetch_from_storage() brings a prompt's blocks back from it into the host tier. Its layout
  /// must be the config's (StorageLayout::from_config) and the cache needs a host tier. With
  /// several groups use `group_storage` instead.
  StorageTier* storage = nullptr;
  /// Several groups: one store (or null: that group's pages are not stored) per group, in
  /// config order, each of its group's layout (StorageLayout::from_config(group_config(g)));
  /// no two groups share a store. The group that owns the blocks (KvCache::full_group(): the one
  /// that attends furthest back) needs one: fetches start from it. A dropped host block is written
  /// to every store whose group kept a page of it, and a fetch reads each group's pages of the
  /// blocks its store holds, so a hit covers every group. Empty: no storage tier.
  std::vector<StorageTier*> group_storage;
  /// Dropped host blocks staged for write-back at once (pinned, block_bytes each); a drop that
  /// finds every staging slot taken is not written back (ControlStats::storage_writes_dropped).
  int64_t storage_staging_blocks = 64;
  /// Offloads and restores of blocks smaller than this many bytes (config.block_bytes()) run as
  /// one copy kernel per direction over the host pool mapped into the device's address space,
  /// instead of one batched copy (cudaMemcpyBatchAsync) per direction; 0 never uses the kernel.
  /// Without a mappable host pool (Backend::mapped_device_pointer) every job is a batched copy.
  /// Negative: kInvalidArgument from create().
  int64_t transfer_kernel_block_bytes = kDefaultTransferKernelBlockBytes;
  /// Tensor parallelism: the ranks (>= 1) whose pools split every group's KV heads, rank r
  /// holding heads [r*H/N, (r+1)*H/N) of each (a latent group whole on every rank). One control
  /// plane decides for all of them: every rank's pools have the same blocks, so one block table
  /// serves every rank's kernels, and every move and copy-on-write runs on every rank (a
  /// failure on any rank takes the call back on all). Each group's num_kv_heads must divide by
  /// it (kInvalidArgument). A storage tier is a store per rank (rank_storage). Each rank's work
  /// runs on its stream of rank_native_compute_streams, else on its backend's default stream;
  /// compute_stream and native_compute_stream are for a cache of one rank.
  int32_t tp_size = 1;
  /// With tp_size > 1: one backend per rank (not owned; each must outlive the cache), rank r's
  /// pools on rank_backends[r]. Empty: the cache creates one per rank from config.backend, on
  /// GPU r (CPU and null backends: every rank in the host's memory, ordinal 0). `backend` and
  /// `device` are for a cache of one rank.
  std::vector<Backend*> rank_backends;
  /// With tp_size > 1: the caller's stream on each rank's device (a cudaStream_t; on the CPU
  /// backend any non-null handle), as native_compute_stream is for one rank: rank r's cache
  /// work is queued on rank_native_compute_streams[r]. Not owned. Empty: the default streams.
  std::vector<void*> rank_native_compute_streams;
  /// With tp_size > 1, the storage tier: rank r's store of group g (not owned, as `storage`) at
  /// rank_storage[r * num_groups + g] (one group: rank_storage[r]), of the layout of that
  /// rank's part (StorageLayout::for_rank(shard_config(g), model_id, tp_size, r)), so a store
  /// written at one TP size or rank never serves another. A dropped host block is written to
  /// every rank's store; a fetch brings back the blocks every rank's store holds. A group's
  /// stores are given on every rank or on none; the owner group's on every rank. Not yet for a
  /// latent group (kUnimplemented). `storage` and `group_storage` are for a cache of one rank.
  std::vector<StorageTier*> rank_storage;
  /// Split-process tensor parallelism, the scheduler's side: record every plan's moves and
  /// copies and every built batch, for take_step_plan() to hand to the worker processes that
  /// hold the ranks' pools (step_plan.hpp). Such a scheduler typically runs on null backends
  /// (no memory). Not with a storage tier (kUnimplemented): its write-backs and fetches are
  /// not steps a worker can replay yet.
  bool record_step_plans = false;
};

/// One tensor-parallel rank's part of a model: every K/V group with num_kv_heads / tp_size
/// heads (a latent group whole), pools of the same blocks. A worker process of a split-process
/// deployment creates its KvCache from it (apply_step_plan). kInvalidArgument for tp_size < 1 or
/// heads that do not divide by it.
StatusOr<CacheConfig> rank_config(const CacheConfig& model, int32_t tp_size);

/// Where a sequence's data is, as far as a reader is concerned.
enum class SequenceResidency : uint8_t {
  kDevice = 0,    // readable on the compute stream now
  kInFlight = 1,  // an offload or restore copy of it has not finished yet
  kHost = 2,      // offloaded: restore (or reserve) it before use
};

/// One step's batch metadata on the device, uploaded on the compute stream. The arrays (and
/// `host`) stay valid until the next build_batch: work that reads them must be queued on the
/// compute stream (or on a stream ordered after it) before that call. The cache's own
/// write_kv_batch refuses a batch once a later call has changed what it describes.
struct DeviceBatch {
  const BatchMetadata* host = nullptr;  // the host copy the arrays were uploaded from
  uint64_t generation = 0;              // which build_batch made it
  /// The KV group whose pool the tables index (CacheConfig::groups index; 0 with one group).
  int32_t group = 0;
  /// The tensor-parallel rank whose device holds the arrays and whose pool they index
  /// (KvCache::rank_batch; 0 without tensor parallelism).
  int32_t rank = 0;
  const int64_t* slot_mapping = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* indptr = nullptr;  // null unless BatchOptions::build_csr
  const int32_t* indices = nullptr;
  const int32_t* last_page_len = nullptr;
  /// `slot_mapping` is the caller's own buffer (build_vllm_batch_into, build_batch_into given
  /// one), at the same address every step and padded to the same length: write_kv_batch over
  /// such a batch may be recorded into a CUDA graph and replayed after the next step's build.
  bool caller_owned_slots = false;
};

/// One host array for KvCache::upload_to_device(): `bytes` bytes at `src` (any host memory) for
/// the device buffer at `dst`.
struct HostUpload {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

/// Bytes the pools took (over every group) and how long they took to allocate.
struct PoolInfo {
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  double device_alloc_ms = 0;
  double host_alloc_ms = 0;      // pinning a large host pool is slow: it is done once, up front
  bool host_mapped = false;      // the device's kernels can address the host pool
  bool transfer_kernel = false;  // offloads and restores go through the copy kernel
};

class KvCache {
 public:
  /// Validates the config (paged mode), creates or borrows the backend, allocates the device
  /// pool and, when num_host_blocks > 0, the pinned host pool, once (per group). kInvalidArgument
  /// names the field; kResourceExhausted when a pool cannot be had; kUnimplemented for dense mode.
  static StatusOr<std::unique_ptr<KvCache>> create(const CacheConfig& config,
                                                   KvCacheOptions options = {});
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  /// The config as given (with one group given as groups[0]: that group's config).
  const CacheConfig& config() const;
  /// Rank `rank`'s backend and compute stream (0 <= rank < tp_size()).
  Backend& backend(int32_t rank = 0);
  Stream compute_stream(int32_t rank = 0) const;
  /// The pools over every rank.
  const PoolInfo& pool_info() const;
  /// The tensor-parallel ranks (KvCacheOptions::tp_size; 1 without tensor parallelism).
  int32_t tp_size() const;
  /// The full-attention group's device pool (the only one with one group) as the data-plane ops
  /// see it (for callers that launch ops themselves).
  PoolRef device_pool() const;

  // ---- KV groups (one without CacheConfig::groups) ----

  int32_t num_groups() const;
  /// The group whose blocks every other group shares: the one block_locations(id), slot() and
  /// the slots reserve() returns describe (0 with one group).
  int32_t full_group() const;
  /// Group `g`'s one-group config (CacheConfig::group_config). Requires 0 <= g < num_groups().
  const CacheConfig& group_config(int32_t g) const;
  /// Group `g`'s device pool on rank `rank`. Requires 0 <= g < num_groups(), 0 <= rank <
  /// tp_size().
  PoolRef device_pool(int32_t g, int32_t rank = 0) const;
  /// What one rank's pool of group `g` holds: group_config(g) with num_kv_heads / tp_size() (a
  /// latent group whole); group_config(g) itself without tensor parallelism. The rows write_kv
  /// and gather_layer take on a rank are of this many heads. Requires 0 <= g < num_groups().
  const CacheConfig& shard_config(int32_t g) const;
  /// Every pool as a region to register with a transfer engine: per rank and group, the device
  /// pool and, when there is one, the host pool (regions.hpp).
  std::vector<PoolRegion> regions() const;
  /// How group `group`'s pool on `tier` (kDevice or kHost) lays its blocks out, with the
  /// fingerprint of its layout and `model_id`. kOutOfRange for a group, kInvalidArgument for
  /// kStorage, kFailedPrecondition for a host tier the cache does not have. Another process that
  /// writes blocks through it (a peer's READ into this pool) must do so after the reserve that
  /// gave it those blocks and a synchronize() (work still queued may touch a reused block), and
  /// before commit, which declares the tokens' K/V written. With tensor parallelism, rank
  /// `rank`'s pool, of its slice of the heads; its fingerprint also names the tp_size and the
  /// rank (the same rank of a deployment of the same size holds the same heads).
  StatusOr<BlockGeometry> block_geometry(int32_t group, Tier tier, const std::string& model_id = "",
                                         int32_t rank = 0) const;
  /// The group and in-group index of a model layer. kOutOfRange.
  StatusOr<LayerGroup> layer_group(int32_t layer) const;

  // ---- sequences (see core::ControlPlane for the full contract of each) ----

  /// Adds a sequence and returns how many prompt tokens are already cached (prefix hit). Cached
  /// blocks found on the host tier count too: the sequence is then kHost until its first
  /// reserve (or a restore/prefetch) brings them back.
  /// With a sliding window (CacheConfig::sliding_window) a hit needs only the blocks inside
  /// the window of its length. With several groups, a hit counts as far as every group can
  /// supply it. `max_cached` >= 0 bounds the tokens shared; -1: no bound.
  StatusOr<int64_t> add_sequence(SequenceId id, const std::vector<TokenId>& prompt,
                                 const SequenceOptions& options = {}, int64_t max_cached = -1);
  /// The tokens add_sequence would share now (at most `max_cached`, -1: no bound), changing
  /// nothing. kOutOfRange for a prompt past max_sequence_length.
  StatusOr<int64_t> cached_prefix(const std::vector<TokenId>& prompt, NamespaceId ns = 0,
                                  int64_t max_cached = -1) const;
  /// Reserves device slots for the next `n` tokens: allocates blocks, restores an offloaded
  /// sequence, queues offloads of others and copy-on-write copies, ordering each on the
  /// streams. Returns the slots (block * block_size + offset), one per token.
  StatusOr<std::vector<int64_t>> reserve(SequenceId id, int64_t n);
  /// Reserves `n_each` slots for each of `ids` (distinct) in one call: a decode step is one
  /// call, not one per sequence. Under pressure the planner frees room for the whole batch at
  /// once and never takes a member. Returns every slot, grouped by sequence in `ids` order. An
  /// error (kNotFound, kInvalidArgument, kOutOfRange, kResourceExhausted) changes nothing.
  StatusOr<std::vector<int64_t>> reserve_batch(const std::vector<SequenceId>& ids, int64_t n_each);
  /// As reserve_batch(), with the slots written into `*slots` (replacing its contents; its
  /// storage is reused, so a decode step that keeps one vector allocates nothing), or not
  /// returned at all when `slots` is null (build_batch() gives them as the slot mapping). On
  /// error `*slots` is empty.
  Status reserve_batch_into(const std::vector<SequenceId>& ids, int64_t n_each,
                            std::vector<int64_t>* slots);
  /// Writes the keys and values of the tokens reserved by the last reserve() into one layer (a
  /// model layer: with several groups, into its group's pool at that group's slots).
  /// `key`/`value` are device pointers to [n, kv_heads, head_dim] with `row_stride` elements
  /// between tokens (0: packed). A latent (MLA) cache takes the latents as `key` and a null
  /// `value` (non-null: kInvalidArgument), here and in every call below that takes values.
  /// kFailedPrecondition when nothing is reserved. With tensor parallelism, into rank `rank`'s
  /// pool, of its heads (shard_config: [n, kv_heads / tp_size, head_dim]); kOutOfRange for a
  /// rank outside the cache.
  Status write_kv(SequenceId id, int32_t layer, const void* key, const void* value,
                  DType input_dtype, int64_t row_stride = 0, int32_t rank = 0);
  /// Writes one layer's K/V of every token of a built batch through its slot mapping, in one
  /// launch: `key`/`value` are [batch.host->slot_mapping.size(), kv_heads, head_dim] (padding
  /// rows are skipped). kFailedPrecondition for a batch that a later call made stale,
  /// kInvalidArgument for one another cache built or one of another group than the layer's.
  /// Into the pool of the batch's rank (rank_batch), of that rank's heads.
  Status write_kv_batch(const DeviceBatch& batch, int32_t layer, const void* key, const void* value,
                        DType input_dtype, int64_t row_stride = 0);
  /// As write_kv_batch, for every layer of the batch's group in one launch: `key`/`value` are
  /// [group layers][tokens, kv_heads, head_dim], in the order CacheConfig::groups lists the
  /// group's layers, with `layer_stride` elements between layers (0: tokens * row_stride).
  Status write_kv_batch_all_layers(const DeviceBatch& batch, const void* key, const void* value,
                                   DType input_dtype, int64_t row_stride = 0,
                                   int64_t layer_stride = 0);
  /// Commits the token ids of the first tokens.size() reserved slots.
  Status commit(SequenceId id, const std::vector<TokenId>& tokens);
  /// Commits `n_each` token ids for each of `ids` (distinct): `tokens` holds them sequence after
  /// sequence, in `ids` order. Everything is checked first (kInvalidArgument, kNotFound,
  /// kFailedPrecondition), so an error commits nothing.
  Status commit_batch(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                      int64_t n_each = 1);
  /// Shortens a sequence to `length` tokens (speculative decoding).
  Status rollback(SequenceId id, int64_t length);
  /// Creates `child` sharing every block of `parent`.
  Status fork(SequenceId parent, SequenceId child);
  /// Removes a sequence; its full blocks stay cached for later prompts.
  Status finish(SequenceId id);
  /// Removes a sequence and the blocks only it held.
  Status erase(SequenceId id);
  /// Replaces the active set (never evicted or offloaded).
  Status set_active(const std::vector<SequenceId>& ids);
  /// Sets a sequence's scheduling priority (lower is offloaded or dropped first).
  Status set_priority(SequenceId id, int32_t priority);

  // ---- tiers ----

  /// Queues the offload of an inactive sequence to the host tier on the copy stream.
  Status offload(SequenceId id);
  /// Queues the restore of an offloaded sequence. The compute stream does not wait for it now:
  /// the first call that reads or writes its blocks (build_batch, gather_layer, write_kv,
  /// reserve, a copy-on-write) orders the compute stream after the copies, so compute queued
  /// meanwhile overlaps them. (With several KV groups the compute stream waits at once.)
  Status restore(SequenceId id);
  /// Queues, as one transfer job, the restore of those of `ids` that are offloaded (or that hit
  /// host-resident prefix blocks) while free or evictable device blocks suffice, never
  /// offloading or dropping another sequence; the rest stay on the host. Call it a step ahead:
  /// as with restore(), compute waits for the copies only where it uses the blocks.
  /// kNotFound (nothing queued) for an unknown id.
  Status prefetch(const std::vector<SequenceId>& ids);
  /// Resident, in flight, or on the host. kNotFound.
  StatusOr<SequenceResidency> residency(SequenceId id);
  /// Sequences dropped (not offloaded) to make room since the last call.
  std::vector<SequenceId> drain_evicted_sequences();

  // ---- storage tier (KvCacheOptions::storage, or group_storage) ----

  /// Starts bringing the blocks the storage tier holds after `prompt`'s cached prefix (full
  /// blocks, device or host) into host slots: free ones first, then those of the least recently
  /// used cached host blocks, which are dropped (and written back) for them as for any arrival of
  /// more valuable blocks; blocks sequences hold and the prefix being continued are never taken.
  /// Returns how many blocks are on their way. It is 0 exactly when: there is no storage tier;
  /// prefix caching is off; every full block of the prompt that a hit could use (one token is
  /// always left to compute) is cached already; the store lacks the first block after the cached
  /// prefix, or cannot be reached; no host slot can be had (the host tier is held by sequences;
  /// with a sliding window, which takes free slots only, fewer are free than the window's missing
  /// blocks, or the store lacks one of them). The blocks become prefix-cache blocks on the host
  /// tier once they have arrived and been verified (see poll_storage()); a sequence added after
  /// that hits them (ControlStats::prefix_host_hit_blocks) and they move to the device like any
  /// host hit. Never waits for the store; a scheduler that wants the hit waits for
  /// storage_in_flight() to drop before add_sequence. kOutOfRange for a prompt past
  /// max_sequence_length. Several groups (group_storage): the count is of the owner group's
  /// blocks; each other group's store is asked which of them it holds, and the pages a hit
  /// needs come in the same arrival.
  StatusOr<int64_t> fetch_from_storage(const std::vector<TokenId>& prompt,
                                       const SequenceOptions& options = {});
  /// fetch_from_storage() for a hit of at most `max_cached` tokens (-1: no bound), also saying
  /// how far a hit reaches once the blocks land. A sliding-window cache fetches the blocks the
  /// window of the longest such hit lacks, all or none. kInvalidArgument for max_cached < -1.
  StatusOr<StorageFetch> fetch_prefix_from_storage(const std::vector<TokenId>& prompt,
                                                   const SequenceOptions& options,
                                                   int64_t max_cached);
  /// Lands finished storage reads (now prefix hits) and hands staged write-backs to the store.
  /// Never waits. add_sequence, reserve and reserve_batch do it too.
  Status poll_storage();
  /// Blocks fetched from storage that have not landed yet.
  int64_t storage_in_flight() const;
  /// Waits until every staged write-back and storage read has finished and landed (tests,
  /// shutdown).
  Status flush_storage();

  // ---- reading and batch metadata ----

  /// Builds a step's metadata for device-resident sequences and uploads it asynchronously.
  /// kInvalidArgument with several groups: build_batches() gives each group's.
  StatusOr<DeviceBatch> build_batch(const std::vector<SequenceId>& ids,
                                    const BatchOptions& options = {});
  /// build_batch() for every group at once: one DeviceBatch per group, in group order, each
  /// with its group's block tables, CSR and slot mapping (-1 in a window group's tables for the
  /// blocks out of its window). One group: one batch, build_batch()'s.
  StatusOr<std::vector<DeviceBatch>> build_batches(const std::vector<SequenceId>& ids,
                                                   const BatchOptions& options = {});
  /// Whether `batch` came from this cache's build_batch (of any generation).
  bool built_here(const DeviceBatch& batch) const;
  /// With tensor parallelism: the same batch (group and generation) as uploaded to rank
  /// `rank`'s device; build_batch and build_batches upload it to every rank and return rank 0's.
  /// Its tables are the same block ids: they index rank `rank`'s pool. kOutOfRange for a rank
  /// outside the cache; kInvalidArgument or kFailedPrecondition as write_kv_batch for a batch
  /// another cache built or one that is stale.
  StatusOr<DeviceBatch> rank_batch(const DeviceBatch& batch, int32_t rank) const;
  /// The device view of a built batch, to pass by value to an attention kernel: the CSR form
  /// when the batch was built with BatchOptions::build_csr, else the block-table form, over its
  /// group's pool on its rank (with its sliding_window). fp8 pools take their dequantisation
  /// `scales` here.
  /// Valid as long as `batch` is.
  device::PagedKvView device_view(const DeviceBatch& batch, KvScales scales = {}) const;
  /// The most arrays one upload_to_device() call takes.
  static constexpr size_t kMaxHostUploads = 4;
  /// Copies host arrays into device buffers the caller owns, on the compute stream, staged
  /// through the cache's pinned upload arena: one host-to-device copy of all of them, then one
  /// device-to-device copy into each `dst`. The host arrays may change or go away as soon as it
  /// returns (pageable memory is never handed to an asynchronous copy), no host function is
  /// queued, and a step whose uploads fit KvCacheOptions::step_shape allocates nothing. Work
  /// queued on the compute stream afterwards sees the bytes. The batch-format helpers
  /// (batch_formats.hpp) fill their fixed buffers with it. Arrays of zero bytes are skipped.
  /// kInvalidArgument for null `arrays` with a count, more than kMaxHostUploads arrays or a null
  /// pointer with bytes; kFailedPrecondition while the compute stream captures a CUDA graph;
  /// nothing is queued on either. A backend error after the upload may leave some of the
  /// device-to-device copies queued. With tensor parallelism, into rank `rank`'s device
  /// buffers, on its compute stream (kOutOfRange for a rank outside the cache).
  Status upload_to_device(const HostUpload* arrays, size_t count, int32_t rank = 0);
  /// Packs positions [position_begin, position_begin + num_tokens) of one (model) layer of a
  /// sequence into device buffers (`num_tokens` < 0: to the end of the committed tokens).
  /// kOutOfRange for positions a window group no longer holds. With tensor parallelism, rank
  /// `rank`'s heads (shard_config).
  Status gather_layer(SequenceId id, int32_t layer, void* key_out, void* value_out,
                      DType packed_dtype, PackedLayout packed_layout, int64_t position_begin = 0,
                      int64_t num_tokens = -1, int32_t rank = 0);

  // ---- split processes: step plans (step_plan.hpp) ----

  /// With KvCacheOptions::record_step_plans: the moves, copies and batches of the calls since
  /// the last take, in call order (what succeeded: a call that failed and was taken back left
  /// nothing). Empty without the option.
  StepPlan take_step_plan();
  /// A worker's side: carries out another cache's plan on this cache's pools, which hold one
  /// rank's part of that cache's model (rank_config) and the same blocks. The moves and copies
  /// are queued in order on the copy and compute streams; each batch record is uploaded, and its
  /// DeviceBatch is returned (in record order; as with build_batch, a batch stays current until
  /// the next one of its group, or the next moves, is applied). Such a cache makes no decisions:
  /// kFailedPrecondition when it holds sequences or cached blocks of its own, and add_sequence
  /// and the storage fetches refuse once it has applied a plan. Every block id, slot and length
  /// is checked against the pools first: kInvalidArgument names the record, and nothing is
  /// queued. A backend failure part way leaves the pools between two steps of the plan: the
  /// cache is then unusable (every later call returns that error) and the worker is rebuilt
  /// from the scheduler's state.
  StatusOr<std::vector<DeviceBatch>> apply_step_plan(const StepPlan& plan);
  /// Blocks the host until the cache's queued work (kernels and transfers, on every rank) is
  /// done.
  Status synchronize();

  // ---- queries (read-only; used by adapters such as SeedKvCache) ----

  /// Whether the sequence exists (offloaded sequences included).
  bool contains(SequenceId id) const;
  /// Committed token count. kNotFound.
  StatusOr<int64_t> length(SequenceId id) const;
  /// Reserved, uncommitted token count. kNotFound.
  StatusOr<int64_t> pending(SequenceId id) const;
  /// Tier and physical id of each block of the sequence (reserved ones included). kNotFound.
  StatusOr<std::vector<BlockLocation>> block_locations(SequenceId id) const;
  /// As block_locations() in group `g`: a window group's pages, -1 for the blocks out of its
  /// window. kOutOfRange for a group outside the cache, kNotFound.
  StatusOr<std::vector<BlockLocation>> block_locations(SequenceId id, int32_t g) const;
  /// Blocks (pages) the sequence holds in group `g`: not those out of a window group's window.
  /// kOutOfRange for a bad group, kNotFound.
  StatusOr<int64_t> held_blocks(SequenceId id, int32_t g = 0) const;
  /// Bytes of the blocks the sequence holds over every group and rank, on whichever tier they are
  /// (an offloaded sequence's host blocks count too; a block shared with other sequences counts in
  /// full). kNotFound.
  StatusOr<int64_t> held_bytes(SequenceId id) const;
  /// The device slot (`block * block_size + offset`) of a committed or reserved position. The
  /// control plane owns every reservation and its slots; ask here rather than keep the slots
  /// reserve() returned, which an offload or restore moves. kNotFound, kOutOfRange (past the
  /// reserved positions), kFailedPrecondition (offloaded: restore it first).
  StatusOr<int64_t> slot(SequenceId id, int64_t position) const;
  /// The slots of the sequence's reserved positions in group `g`'s pool (in position order).
  /// kOutOfRange for a bad group, kNotFound, kFailedPrecondition (offloaded).
  StatusOr<std::vector<int64_t>> reserved_slots(SequenceId id, int32_t g) const;

  // ---- observability ----

  /// The counters of the cache (with several groups: of the blocks, which are the owner
  /// group's, and of what every group does once: sequences, prefix lookups, moves).
  ControlStats stats() const;
  /// The counters as group `g` sees them: both tiers' counts and bytes of its own pools, the
  /// pages it evicted (blocks_evicted, on either tier) and released as they fell out of its
  /// window (window_released_blocks); every other counter is stats()'s, which counts once for
  /// all groups. One group: stats(). kOutOfRange for a group outside the cache.
  StatusOr<ControlStats> group_stats(int32_t g) const;
  std::vector<ControlEvent> drain_events();
  /// The control plane's invariants (kInternal names the first broken one), plus the cache's
  /// own: every pending reservation belongs to a live sequence, and every upload region still
  /// held belongs to the last batch or to a reservation.
  Status check_invariants() const;

 private:
  // The cache's state and its private helpers: src/runtime/kv_cache_impl.hpp.
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv
